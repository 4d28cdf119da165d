"""A search spec (YAML text, a file, or a dict) -> the remat.v1.SearchSpec message.

The keys are the spec file's (docs/spec.md): sections ``model``, ``train``,
``parallel``, ``search`` and a top-level ``name``; their fields carry the proto's names, so the
mapping is by name. Omitted fields stay unset and the coordinator fills Megatron Core's defaults
and validates the whole spec (its INVALID_ARGUMENT names the field). This module refuses only
what a message cannot hold: unknown keys and values of the wrong type, naming the key.
"""

import os

from ._stubs import remat_pb2

_SECTIONS = {
    "model": remat_pb2.ModelSpec,
    "train": remat_pb2.TrainSpec,
    "parallel": remat_pb2.ParallelSpec,
    "search": remat_pb2.SearchOptions,
}


class SpecError(ValueError):
    """A spec the client cannot turn into a message; the text names the key."""


def load_spec(spec):
    """Returns (dict, folder or None): a dict as is; a str naming a file is read (its folder is
    returned, and its stem is the default name); any other str is YAML text."""
    if isinstance(spec, dict):
        return spec, None
    if not isinstance(spec, str):
        raise SpecError("spec: must be a dict, a file path or YAML text, got %s" % type(spec).__name__)
    import yaml  # Debian's python3-yaml; only needed for text specs

    folder, name = None, None
    text = spec
    if "\n" not in spec and os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            text = f.read()
        folder = os.path.dirname(os.path.abspath(spec))
        name = os.path.splitext(os.path.basename(spec))[0]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError("spec: not valid YAML: %s" % str(e).replace("\n", " ")) from None
    if not isinstance(data, dict):
        if folder is None and "\n" not in spec:
            raise SpecError("spec: %r is neither a file nor a YAML mapping" % spec)
        raise SpecError("spec: must be a YAML mapping")
    if name is not None and not data.get("name"):
        data = dict(data, name=name)
    return data, folder


def _set_field(msg, key, value, where):
    field = msg.DESCRIPTOR.fields_by_name.get(key)
    if field is None:
        raise SpecError("%s: unknown key" % where)
    if value is None:
        return  # null: the default, as in the spec file
    try:
        if field.label == field.LABEL_REPEATED:
            if not isinstance(value, (list, tuple)):
                raise TypeError("must be a list")
            del getattr(msg, key)[:]
            getattr(msg, key).extend(value)
        elif field.type == field.TYPE_BOOL and not isinstance(value, bool):
            raise TypeError("must be true or false")
        elif field.type == field.TYPE_DOUBLE and isinstance(value, bool):
            raise TypeError("must be a number")
        elif field.type == field.TYPE_DOUBLE:
            setattr(msg, key, float(value) if isinstance(value, int) else value)
        else:
            setattr(msg, key, value)
    except (TypeError, ValueError) as e:
        raise SpecError("%s: %s, got %r" % (where, str(e).split("\n")[0], value)) from None


def to_proto(spec):
    """Returns (remat_pb2.SearchSpec, folder or None) for a dict, a spec file or YAML text."""
    data, folder = load_spec(spec)
    out = remat_pb2.SearchSpec()
    for key, value in data.items():
        if key == "name":
            if value is not None:
                if not isinstance(value, str):
                    raise SpecError("name: must be a string")
                out.name = value
            continue
        if key not in _SECTIONS:
            raise SpecError("%s: unknown key" % key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise SpecError("%s: must be a mapping of keys to values" % key)
        section = getattr(out, key)
        section.SetInParent()
        for field, v in value.items():
            where = "%s.%s" % (key, field)
            if key == "model" and field == "moe_layer_freq" and isinstance(v, (list, tuple)):
                # The spec's list form is the proto's explicit per-layer pattern.
                _set_field(section, "moe_layer_pattern", v, where)
            elif key == "model" and field == "q_lora_rank" and v is None:
                # null: no q compression, which the proto spells 0 (unset means the default 512).
                section.q_lora_rank = 0
            elif key == "search" and field == "backend" and v == "replay":
                raise SpecError("search.backend: replay specs are submitted with `remat submit` "
                                "(the Python client does not read replay tables)")
            else:
                _set_field(section, field, v, where)
    if not out.HasField("model"):
        raise SpecError("model: required")
    return out, folder
