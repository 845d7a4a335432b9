import sys

from assignor.cli import main

sys.exit(main())
