import sys

from segserve.cli import main

sys.exit(main())
