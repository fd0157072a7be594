import sys

from bench.overhead import main

sys.exit(main())
