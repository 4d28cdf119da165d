"""Sends one MUNGE credential twice to rematd (slurm_prolog_test.sh): the first call is the
credential's user's, the second must be refused UNAUTHENTICATED (munged detects the replay).

Usage: munge_replay.py ADDRESS CREDENTIAL PYTHON_CLIENT_DIR
"""
import sys

sys.path.insert(0, sys.argv[3])
import grpc  # noqa: E402
from remat_client._stubs import remat_pb2, remat_pb2_grpc  # noqa: E402

stub = remat_pb2_grpc.RematServiceStub(grpc.insecure_channel(sys.argv[1]))
md = (("authorization", "Munge " + sys.argv[2]),)
first = stub.ListSearches(remat_pb2.ListSearchesRequest(), metadata=md, timeout=10)
if [s.owner for s in first.searches] != ["nobody"]:
    sys.exit("first call: %r" % first)
try:
    stub.ListSearches(remat_pb2.ListSearchesRequest(), metadata=md, timeout=10)
    sys.exit("the replayed credential was accepted")
except grpc.RpcError as e:
    if e.code() != grpc.StatusCode.UNAUTHENTICATED:
        sys.exit("replay: %s %s" % (e.code(), e.details()))
    print(e.details())
