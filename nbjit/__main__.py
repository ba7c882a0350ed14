import sys

from nbjit.cli.main import main

sys.exit(main())
