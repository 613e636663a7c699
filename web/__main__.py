import sys

from web.server import main

sys.exit(main())
