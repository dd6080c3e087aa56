"""``python -m streamtrain_tools.bench.serving``: the room's headline benchmark, ``run``."""

import sys

from streamtrain_tools.bench.serving.run import main

sys.exit(main())
