"""The remat.v1 stubs generated from proto/remat/v1/remat.proto at build time.

The build (clients/python/CMakeLists.txt) runs protoc with grpc_python_plugin into ``_gen/``
beside this file. protoc names the modules after the proto's path (``remat.v1.remat_pb2``) and
the gRPC module imports the messages by that absolute name, so ``_gen`` goes on ``sys.path``.
"""

import os
import sys

_GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gen")
if not os.path.isdir(os.path.join(_GEN, "remat", "v1")):
    raise ImportError(
        "remat_client: the generated stubs are missing (%s); build the target remat_python_client "
        "and put <build>/clients/python on PYTHONPATH" % _GEN)
if _GEN not in sys.path:
    sys.path.insert(0, _GEN)

from remat.v1 import remat_pb2  # noqa: E402
from remat.v1 import remat_pb2_grpc  # noqa: E402

__all__ = ["remat_pb2", "remat_pb2_grpc"]
