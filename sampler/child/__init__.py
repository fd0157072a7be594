"""What runs in the sampling child: a fresh interpreter the backend spawns, which
samples the collectors into the ring (``sampler.child.main``)."""
