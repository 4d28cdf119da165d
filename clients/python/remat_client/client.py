"""Client: the user's side of remat.v1.RematService from Python.

    from remat_client import Client
    c = Client("127.0.0.1:50051")              # token=..., tls=True, tls_ca="ca.pem"
    sid = c.submit("examples/tiny-dense.yaml")  # a path, YAML text or a dict
    final = c.watch(sid, lambda p: print(p["trials_done"], "/", p["trials_planned"]))
    for row in c.rows(sid):
        print(row["policy"], row["status"], row["memory_bytes"], row["tokens_per_s"])

Every failed call raises RematError carrying the gRPC status code and the server's message;
a spec the client cannot encode raises SpecError (a ValueError) naming the key.
"""

import os
import time

import grpc
from ._stubs import remat_pb2, remat_pb2_grpc
from .spec import to_proto

_FINAL_STATES = (
    remat_pb2.SEARCH_STATE_SUCCEEDED,
    remat_pb2.SEARCH_STATE_FAILED,
    remat_pb2.SEARCH_STATE_CANCELLED,
)


# Codes of a coordinator that is away (restarting, draining, unreachable): watch tries again.
_RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
)


class RematError(Exception):
    """A failed call. ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, code, details, address):
        self.code = code
        self.details = details
        self.address = address
        super().__init__("coordinator at %s: %s: %s" % (address, code.name, details))


def _state_name(state):
    # SEARCH_STATE_SUCCEEDED -> "succeeded", as `remat get --json` writes it.
    return remat_pb2.SearchState.Name(state)[len("SEARCH_STATE_"):].lower()


def _status_name(status):
    return remat_pb2.TrialStatus.Name(status)[len("TRIAL_STATUS_"):].lower()


def _enum_name(field, value):
    name = field.enum_type.values_by_number[value].name if value in \
        field.enum_type.values_by_number else str(value)
    if field.enum_type.name == "SearchState":
        return name[len("SEARCH_STATE_"):].lower()
    if field.enum_type.name == "TrialStatus":
        return name[len("TRIAL_STATUS_"):].lower()
    return name


def _value(field, value):
    if field.type == field.TYPE_MESSAGE:
        return _to_dict(value)
    if field.type == field.TYPE_ENUM:
        return _enum_name(field, value)
    return value


def _to_dict(message):
    """A message as a plain dict by proto field names: 64-bit integers stay ints, enums are
    lower-case names ("succeeded", "ok"), and a field the message does not carry (an unset
    optional or sub-message) is None rather than a made-up zero."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.label == field.LABEL_REPEATED:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                vf = field.message_type.fields_by_name["value"]
                out[field.name] = {k: _value(vf, v) for k, v in value.items()}
            else:
                out[field.name] = [_value(field, v) for v in value]
        elif (field.type == field.TYPE_MESSAGE or field.containing_oneof is not None) and \
                not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out


class Client:
    """A connection to a coordinator (rematd).

    address: HOST:PORT (default: env REMAT_COORDINATOR). token: the user's bearer token
    (default: env REMAT_TOKEN), sent as ``authorization: Bearer TOKEN``. tls: connect with TLS
    (system roots, or the CA in the PEM file ``tls_ca``). timeout: deadline of each unary call,
    seconds; watch has none (a search may run for hours).
    """

    def __init__(self, address=None, token=None, tls=False, tls_ca=None, timeout=30.0):
        self.address = address or os.environ.get("REMAT_COORDINATOR", "")
        if not self.address:
            raise ValueError("address: required (HOST:PORT, or set REMAT_COORDINATOR)")
        if token is None:
            token = os.environ.get("REMAT_TOKEN")
        self._metadata = (("authorization", "Bearer " + token.strip()),) if token else ()
        self.timeout = timeout
        if tls or tls_ca:
            root = None
            if tls_ca:
                with open(tls_ca, "rb") as f:
                    root = f.read()
            self._channel = grpc.secure_channel(self.address,
                                                grpc.ssl_channel_credentials(root_certificates=root))
        else:
            self._channel = grpc.insecure_channel(self.address)
        self._stub = remat_pb2_grpc.RematServiceStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, **kwargs):
        try:
            return method(request, metadata=self._metadata, **kwargs)
        except grpc.RpcError as e:
            raise RematError(e.code(), e.details(), self.address) from None

    # ---- calls ---------------------------------------------------------------------------------

    def submit(self, spec):
        """Submits a search; returns its id ("s-..."). ``spec``: a dict with the spec file's
        sections, a path to a spec file, or YAML text."""
        message, _ = to_proto(spec)
        request = remat_pb2.SubmitSearchRequest(spec=message)
        return self._call(self._stub.SubmitSearch, request, timeout=self.timeout).id

    def search(self, search_id):
        """The remat_pb2.Search message."""
        return self._call(self._stub.GetSearch, remat_pb2.GetSearchRequest(id=search_id),
                          timeout=self.timeout)

    def get(self, search_id):
        """The search as a dict: the Search message's fields by their proto names, ``state`` as
        "queued" | "running" | "succeeded" | "failed" | "cancelled"."""
        return _to_dict(self.search(search_id))

    def rows(self, search_id):
        """One dict per trial, in the order the planner proposed them: id, policy, status ("ok",
        "oom", ...), peak_allocated_bytes and peak_reserved_bytes (max over ranks), memory_bytes
        (per the search's memory_metric), step_time_s, tokens_per_s, on_frontier, recommended,
        predicted, reused, reason, message. Figures a trial did not measure are None."""
        s = self.search(search_id)
        frontier = set(s.frontier)
        out = []
        for t in s.trials:
            r = t.result
            measured = t.status == remat_pb2.TRIAL_STATUS_OK
            ranks = list(r.ranks)
            alloc = max((x.peak_allocated_bytes for x in ranks), default=None)
            reserved = max((x.peak_reserved_bytes for x in ranks), default=None)
            if not ranks or not (measured or t.status == remat_pb2.TRIAL_STATUS_OOM):
                alloc = reserved = None
            out.append({
                "id": t.id,
                "policy": t.policy.canonical,
                "status": _status_name(t.status),
                "peak_allocated_bytes": alloc,
                "peak_reserved_bytes": reserved,
                "memory_bytes": alloc if s.memory_metric == "allocated" else reserved,
                "step_time_s": r.step_time_s if measured else None,
                "tokens_per_s": r.tokens_per_s if measured else None,
                "on_frontier": t.policy.canonical in frontier,
                "recommended": s.HasField("recommendation")
                and t.policy.canonical == s.recommendation,
                "predicted": r.predicted,
                "reused": r.reused,
                "reason": t.reason,
                "message": r.message,
            })
        return out

    def watch(self, search_id, callback=None, max_quiet_s=None):
        """Follows a search until it ends, calling ``callback(progress)`` with each update as a
        dict (the SearchProgress fields: state, trials_done, trials_planned, frontier,
        best_policy, last_trial, eta_s, ...). Returns the final search as ``get`` does.

        It outlives a coordinator restart, as ``remat watch`` does: a call that fails with
        UNAVAILABLE, CANCELLED, ABORTED or INTERNAL (the coordinator going away, restarting or
        draining; the state read included) is tried again with a backoff from 0.2 s doubling to
        5 s, and the watch picks up the resumed search. It gives up with that RematError once
        nothing has been heard for ``max_quiet_s`` seconds (default: the larger of 60 and the
        client's ``timeout``). Any other refusal (NOT_FOUND, UNAUTHENTICATED, ...) raises at
        once."""
        if max_quiet_s is None:
            max_quiet_s = max(60.0, self.timeout or 0)
        last_ok = time.monotonic()
        backoff_s = 0.2
        while True:
            try:
                current = self._stub.GetSearch(remat_pb2.GetSearchRequest(id=search_id),
                                               metadata=self._metadata, timeout=self.timeout)
                last_ok = time.monotonic()
                if current.state in _FINAL_STATES:
                    return _to_dict(current)
                for progress in self._stub.WatchSearch(
                        remat_pb2.WatchSearchRequest(id=search_id), metadata=self._metadata):
                    last_ok = time.monotonic()
                    backoff_s = 0.2
                    if callback is not None:
                        callback(_to_dict(progress))
                    if progress.state in _FINAL_STATES:
                        return self.get(search_id)
                error = None  # the stream ended early without an error: resume
            except grpc.RpcError as e:
                if e.code() not in _RETRYABLE:
                    raise RematError(e.code(), e.details(), self.address) from None
                error = RematError(e.code(), e.details(), self.address)
            except RematError as e:  # from get() after the final update
                if e.code not in _RETRYABLE:
                    raise
                error = e
            if error is not None and time.monotonic() - last_ok > max_quiet_s:
                raise error
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 5.0)

    def cancel(self, search_id):
        """Cancels a search; returns its state name."""
        r = self._call(self._stub.CancelSearch, remat_pb2.CancelSearchRequest(id=search_id),
                       timeout=self.timeout)
        return _state_name(r.state)

    def list(self, limit=100):
        """The caller's searches (an admin's token: every user's), newest first, as dicts."""
        r = self._call(self._stub.ListSearches, remat_pb2.ListSearchesRequest(limit=limit),
                       timeout=self.timeout)
        return [_to_dict(x) for x in r.searches]
