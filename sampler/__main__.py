import sys

from sampler.commands import main

sys.exit(main())
