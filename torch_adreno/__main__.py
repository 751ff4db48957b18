import sys

from torch_adreno.cli import main

sys.exit(main())
