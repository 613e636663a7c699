import sys

from funnel_client.cli import main

sys.exit(main())
