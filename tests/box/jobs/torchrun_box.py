#!/usr/bin/python3
"""box: torchrun with one fix for Debian bookworm's python3-torch 1.13.1 under Python 3.11: its
Std.from_str("0") returns None (3.11's Flag iteration leaves out the zero member), which breaks
the default --redirects/--tee; "0" is Std.NONE."""

import sys

from torch.distributed.elastic.multiprocessing import api

_from_str = api.Std.from_str
api.Std.from_str = classmethod(lambda cls, vm: api.Std.NONE if vm == "0" else _from_str(vm))
from torch.distributed.run import main  # noqa: E402

sys.exit(main())
