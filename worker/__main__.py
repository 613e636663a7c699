import sys

from worker.main import main

sys.exit(main())
