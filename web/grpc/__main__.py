import sys

from funnel.web.grpc.server import main

sys.exit(main())
