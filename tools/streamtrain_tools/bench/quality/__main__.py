"""``python -m streamtrain_tools.bench.quality``: the room's headline benchmark, ``run``."""

import sys

from streamtrain_tools.bench.quality.run import main

sys.exit(main())
