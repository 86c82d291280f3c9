import sys

from explain.cli import main

sys.exit(main())
