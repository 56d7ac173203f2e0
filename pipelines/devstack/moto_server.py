"""``moto_server``, started by the dev stack and the tests as ``python <this file>``.

moto's own server, unchanged but for one lookup: to route a request, moto asks whether the Host
header names one of its service packages, and answers by listing its installed package folder
and calling ``isdir`` on each of its ~180 entries -- twice for every request (moto 5.2).  A
tritonserver loading from S3 sends a HeadBucket before every file-system call (60-100 requests
per model load, 3 per model for a repository index), and that listing was half of moto's CPU:
2.9 ms per HeadBucket on this machine, 1.7 ms with the listing made once at start (the folder
does not change while the server runs).  Everything else -- routing, the S3 backend, werkzeug's
threaded server -- is moto's.
"""

from __future__ import annotations

import sys


def main() -> None:
    from moto import backends
    from moto.server import main as moto_main

    if hasattr(backends, "list_of_moto_modules"):  # moto 5.2's name; another release: as it is
        modules = tuple(backends.list_of_moto_modules())
        backends.list_of_moto_modules = lambda: iter(modules)  # type: ignore[assignment]
    moto_main(sys.argv[1:])


if __name__ == "__main__":
    main()
