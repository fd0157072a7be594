"""Callbacks for training frameworks (Lightning, Hugging Face Transformers): each module imports its
framework, so importing ``sampler`` imports neither."""
