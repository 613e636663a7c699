import sys

from funnel.worker.main import main

sys.exit(main())
