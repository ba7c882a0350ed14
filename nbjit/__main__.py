import sys

from nbjit.cli import main

sys.exit(main())
