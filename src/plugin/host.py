"""poolserve's IO-processor plugin host: one process runs one plugin for one model.

poolserve starts this file with `python -c`, talks to it over its stdin and stdout in frames
(docs/plugins.md "The protocol"), and kills and restarts it when it crashes, hangs or runs out
of memory. A plugin written for vLLM (`vllm.plugins.io_processors.interface.IOProcessor`) ports
by importing from `poolserve_plugins` instead of `vllm.*`; this file is that module too.
"""

import importlib
import json
import os
import struct
import sys
import traceback
import types
from array import array
from typing import Generic, TypeVar

try:
    import numpy
except ImportError:  # the plugins' arrays fall back to a small pure-Python matrix
    numpy = None


# ---- what a plugin imports (vLLM's names) ------------------------------------------------------

def _pydantic_model(name, fields, base=None):
    """A pydantic model when pydantic is installed (as vLLM's request types are), else None."""
    try:
        import pydantic
    except ImportError:
        return None
    return pydantic.create_model(name, __base__=base or pydantic.BaseModel, **fields)


class PoolingParams:
    """vLLM's PoolingParams as a plugin sets them: `task` picks the model's output."""

    def __init__(self, task=None, **kwargs):
        self.task = task
        for key, value in kwargs.items():
            setattr(self, key, value)


class Matrix:
    """A row-major float32 array without numpy: `tolist()`, `len()`, indexing and `shape`."""

    def __init__(self, values, shape):
        self.values, self.shape = values, tuple(shape)

    def __len__(self):
        return self.shape[0]

    def tolist(self):
        if len(self.shape) == 1:
            return self.values.tolist()
        cols = self.shape[1]
        return [self.values[r * cols:(r + 1) * cols].tolist() for r in range(self.shape[0])]

    def __getitem__(self, index):
        return self.tolist()[index]


class PoolingOutput:
    def __init__(self, data):
        self.data = data


class PoolingRequestOutput:
    """One prompt's result, as vLLM hands it to `post_process`."""

    def __init__(self, request_id, outputs, prompt_token_ids, finished=True):
        self.request_id = request_id
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = 0
        self.finished = finished


class _Usage(dict):
    """vLLM's UsageInfo without pydantic: a dict with its fields as attributes."""

    def __init__(self, prompt_tokens=0, total_tokens=0, completion_tokens=0, **extra):
        super().__init__(prompt_tokens=prompt_tokens, total_tokens=total_tokens, completion_tokens=completion_tokens, **extra)
        self.__dict__ = self


UsageInfo = _pydantic_model(
    "UsageInfo", {"prompt_tokens": (int, 0), "total_tokens": (int, 0), "completion_tokens": (int | None, 0)}
) or _Usage


def TokensPrompt(prompt_token_ids, **extra):
    return dict(prompt_token_ids=list(prompt_token_ids), **extra)


def TextPrompt(prompt, **extra):
    return dict(prompt=prompt, **extra)


PromptType = object


def is_list_of(value, kind):
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def init_logger(name):
    import logging
    return logging.getLogger(name)


class ModelConfig:
    def __init__(self, settings):
        self.model = settings.get("model")
        self.served_model_name = settings.get("served_model_name")
        self.max_model_len = settings.get("max_model_len")
        self.hf_config = settings.get("config") or {}


class VllmConfig:
    def __init__(self, settings):
        self.model_config = ModelConfig(settings)


class Tokenizer:
    """The model's tokenizer.json (the `tokenizers` package) with transformers' names."""

    def __init__(self, folder):
        from tokenizers import Tokenizer as Fast
        self._fast = Fast.from_file(os.path.join(folder, "tokenizer.json"))
        config = {}
        path = os.path.join(folder, "tokenizer_config.json")
        if os.path.exists(path):
            with open(path) as f:
                config = json.load(f)
        for role in ("unk", "mask", "cls", "sep", "pad", "bos", "eos"):
            token = config.get(f"{role}_token")
            if isinstance(token, dict):
                token = token.get("content")
            setattr(self, f"{role}_token", token)
            setattr(self, f"{role}_token_id", self._fast.token_to_id(token) if token else None)

    def encode(self, text, add_special_tokens=True):
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=False):
        return self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            found = self._fast.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._fast.id_to_token(ids)
        return [self._fast.id_to_token(i) for i in ids]


def convert_ids_list_to_tokens(tokenizer, token_ids):
    """vLLM's helper: each id as the text it decodes to."""
    return [tokenizer.decode([i]) for i in token_ids]


class BaseRenderer:
    def __init__(self, folder):
        self._folder, self._tokenizer = folder, None

    def get_tokenizer(self):
        if self._tokenizer is None:
            if not self._folder:
                raise RuntimeError("this model's tokenizer.json is not in a local folder")
            self._tokenizer = Tokenizer(self._folder)
        return self._tokenizer


IOProcessorInput = TypeVar("IOProcessorInput")
IOProcessorOutput = TypeVar("IOProcessorOutput")


class IOProcessor(Generic[IOProcessorInput, IOProcessorOutput]):
    """vLLM's IOProcessor: `parse_data`, `merge_pooling_params`, `pre_process`, `post_process`."""

    def __init__(self, vllm_config, renderer=None):
        self.vllm_config = vllm_config

    def parse_data(self, data):
        raise NotImplementedError

    def merge_pooling_params(self, params=None):
        return params or PoolingParams(task="plugin")

    def pre_process(self, prompt, request_id=None, **kwargs):
        raise NotImplementedError

    def post_process(self, model_output, request_id=None, **kwargs):
        raise NotImplementedError


CompletionRequestMixin = _pydantic_model(
    "CompletionRequestMixin", {"input": ((list[int] | list[list[int]] | str | list[str]), ...)}
)


def _as_module():
    """This file's names as the module `poolserve_plugins` that plugins import."""
    module = types.ModuleType("poolserve_plugins")
    for name in ("IOProcessor", "PoolingParams", "PoolingOutput", "PoolingRequestOutput", "UsageInfo", "TokensPrompt",
                 "TextPrompt", "PromptType", "is_list_of", "init_logger", "VllmConfig", "BaseRenderer",
                 "convert_ids_list_to_tokens", "CompletionRequestMixin", "Matrix"):
        setattr(module, name, globals()[name])
    sys.modules["poolserve_plugins"] = module


# ---- finding plugins ----------------------------------------------------------------------------

ENTRY_POINT_GROUPS = ("poolserve.io_processor_plugins", "vllm.io_processor_plugins")


def installed(paths):
    """Plugins by name: folders of the search path with an `__init__.py`, and entry points."""
    found = {}
    for folder in paths:
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if os.path.isfile(os.path.join(folder, name, "__init__.py")):
                found.setdefault(name, ("folder", folder))
    try:
        from importlib.metadata import entry_points
        for group in ENTRY_POINT_GROUPS:
            for point in entry_points(group=group):
                found.setdefault(point.name, ("entry_point", point))
    except Exception:  # a broken distribution must not hide the folders' plugins
        pass
    return found


def load(name, paths, settings):
    found = installed(paths)
    if name not in found:
        return None, sorted(found)
    kind, where = found[name]
    if kind == "folder":
        sys.path.insert(0, where)
        register = importlib.import_module(name).register
    else:
        register = where.load()
    module_name, _, class_name = register().rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(VllmConfig(settings), BaseRenderer(settings.get("tokenizer_dir"))), sorted(found)


# ---- the protocol -------------------------------------------------------------------------------

def read_frame(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None, []
    header_len, blob_count = struct.unpack("<II", head)
    header = json.loads(stream.read(header_len))
    blobs = []
    for _ in range(blob_count):
        (size,) = struct.unpack("<Q", stream.read(8))
        blobs.append(stream.read(size))
    return header, blobs


def write_frame(stream, header):
    write_body(stream, json.dumps(header, default=_jsonable).encode())


def write_body(stream, body):
    stream.write(struct.pack("<II", len(body), 0) + body)
    stream.flush()


def data_reply(output):
    """`{"ok": true, "data": output}`; a pydantic output writes its own JSON (pydantic's
    serializer is several times faster than `json.dumps` of `model_dump()`)."""
    if hasattr(output, "model_dump_json"):
        return b'{"ok": true, "data": ' + output.model_dump_json().encode() + b"}"
    return json.dumps({"ok": True, "data": output}, default=_jsonable).encode()


def _jsonable(value):
    """A plugin's output as JSON: pydantic models, dataclasses, arrays."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses
        return dataclasses.asdict(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"the plugin's output holds a {type(value).__name__}, which has no JSON form")


def status_of(error):
    """vLLM's mapping: ValueError (pydantic's ValidationError is one) and TypeError are the
    client's fault, NotImplementedError is 501, anything else 500."""
    if isinstance(error, (ValueError, TypeError, OverflowError)):
        return 400
    if isinstance(error, NotImplementedError):
        return 501
    return 500


def prompt_of(prompt):
    if isinstance(prompt, str):
        return {"text": prompt}
    if is_list_of(prompt, int):
        return {"token_ids": prompt}
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return {"token_ids": list(prompt["prompt_token_ids"])}
    if isinstance(prompt, dict) and "prompt" in prompt:
        return {"text": prompt["prompt"]}
    raise TypeError("Prompt should be a string, list of tokens, or dictionary")


def outputs_of(header, blobs):
    outputs = []
    for i, item in enumerate(header["outputs"]):
        ids = array("I", blobs[2 * i]).tolist()
        values = array("f", blobs[2 * i + 1])
        if numpy is not None:
            data = numpy.frombuffer(blobs[2 * i + 1], dtype="<f4").reshape(item["shape"])
        else:
            data = Matrix(values, item["shape"])
        outputs.append(PoolingRequestOutput(f"{header['request_id'] or 'offline'}-{i}", PoolingOutput(data), ids))
    return outputs


def serve(processor, inbound, outbound):
    while True:
        header, blobs = read_frame(inbound)
        if header is None:
            return
        try:
            if header["op"] == "pre_process":
                parsed = processor.parse_data(header["data"])
                raw = processor.pre_process(parsed, request_id=header["request_id"])
                prompts = raw if isinstance(raw, (list, tuple)) and not is_list_of(raw, int) else [raw]
                if not prompts:
                    raise ValueError("You must pass at least one prompt")
                params = processor.merge_pooling_params()
                reply = {"ok": True, "prompts": [prompt_of(p) for p in prompts], "task": getattr(params, "task", None)}
            elif header["op"] == "post_process":
                output = processor.post_process(outputs_of(header, blobs), request_id=header["request_id"])
                write_body(outbound, data_reply(output))
                continue
            else:
                reply = {"ok": False, "status": 500, "message": f"unknown operation {header['op']!r}"}
            write_frame(outbound, reply)
        except MemoryError:
            write_frame(outbound, {"ok": False, "status": 500, "message": "the plugin ran out of memory", "restart": True})
        except BaseException as error:  # the plugin's fault, reported; the host goes on
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            traceback.print_exc(file=sys.stderr)
            write_frame(outbound, {"ok": False, "status": status_of(error), "message": str(error) or type(error).__name__})


def main():
    # The protocol owns the real stdout; a plugin's print() goes to stderr with its logs.
    outbound = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inbound = sys.stdin.buffer
    _as_module()
    header, _ = read_frame(inbound)
    limit = header.get("memory_limit_bytes")
    if limit:
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        processor, names = load(header["plugin"], header["paths"], header["model"])
    except BaseException as error:
        traceback.print_exc(file=sys.stderr)
        write_frame(outbound, {"ok": False, "status": 500, "message": f"{type(error).__name__}: {error}"})
        return
    if processor is None:
        write_frame(outbound, {"ok": False, "status": 404, "plugins": names})
        return
    write_frame(outbound, {"ok": True, "plugins": names, "pid": os.getpid()})
    serve(processor, inbound, outbound)


main()
