import sys

from funnel.web.server import main

sys.exit(main())
