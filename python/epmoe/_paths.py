"""_paths — where libepmoe and epmoectl were when the package was built.

In the source tree both are None; `pip install` (setup.py's build_py) writes this file into
the wheel with the paths it found then: $EPMOE_LIBRARY / $EPMOE_CTL, else pkg-config's libdir
for epmoe, else the build tree beside the package (../build/client, ../build/ctl).
"""

from typing import Optional

LIBRARY: Optional[str] = None
CTL: Optional[str] = None
