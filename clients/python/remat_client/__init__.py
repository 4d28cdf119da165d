"""remat_client: submit, watch and read remat searches from Python (remat.v1 over gRPC).

Needs Debian's python3-grpcio and python3-protobuf (and python3-yaml for specs given as files or
YAML text). See clients/python/README.md.
"""

from .client import Client, RematError
from .spec import SpecError, to_proto

__all__ = ["Client", "RematError", "SpecError", "to_proto"]
