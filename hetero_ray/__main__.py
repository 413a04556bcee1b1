import sys

from hetero_ray.cli.main import main

sys.exit(main())
