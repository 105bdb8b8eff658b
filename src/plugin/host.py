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

_CHANNEL = None  # (inbound, outbound): the pipe to the server, for the tokenizer's questions

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
    """vLLM's PoolingParams as a plugin sets them in `merge_pooling_params`: `task` picks the
    model's output (vLLM 0.33's compound "embed&token_classify" included), `dimensions` and
    `use_activation` shape it, `skip_reading_prefix_cache` leaves the server's output cache
    unread; the others are kept and have no effect."""

    SENT = ("task", "dimensions", "use_activation", "skip_reading_prefix_cache")

    def __init__(self, task=None, dimensions=None, use_activation=None, skip_reading_prefix_cache=None,
                 truncate_prompt_tokens=None, **kwargs):
        self.task = task
        self.dimensions = dimensions
        self.use_activation = use_activation
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.truncate_prompt_tokens = truncate_prompt_tokens
        for key, value in kwargs.items():
            setattr(self, key, value)

    def clone(self):
        import copy
        return copy.deepcopy(self)

    def sent(self):
        return {key: getattr(self, key, None) for key in self.SENT}


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
        """numpy's indexing for what plugins do: an int (a value, or a row), a slice (a view
        as a Matrix again, so `data[:n].tolist()` works as on an ndarray)."""
        rows = self.shape[0]
        cols = self.shape[1] if len(self.shape) > 1 else 1
        if isinstance(index, slice):
            picked = range(rows)[index]
            if len(self.shape) == 1:
                return Matrix(array("f", (self.values[i] for i in picked)), (len(picked),))
            values = array("f")
            for r in picked:
                values.extend(self.values[r * cols:(r + 1) * cols])
            return Matrix(values, (len(picked), cols))
        r = range(rows)[index]  # an IndexError past the end, negative indexes from it
        if len(self.shape) == 1:
            return self.values[r]
        return Matrix(self.values[r * cols:(r + 1) * cols], (cols,))


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


class PoolerConfig:
    """vLLM's PoolerConfig: the server's pooler defaults (`--pooler-config`), None where unset."""

    def __init__(self, settings):
        self.task = settings.get("task")
        self.pooling_type = settings.get("pooling_type")
        self.use_activation = settings.get("use_activation")
        self.dimensions = settings.get("dimensions")
        self.normalize = settings.get("normalize")
        self.enable_chunked_processing = False
        self.max_embed_len = None
        self.step_tag_id = None
        self.returned_token_ids = None


class _Attributes(dict):
    """config.json as transformers' PretrainedConfig reads: attributes, and a dict too."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self):
        return dict(self)


class ModelConfig:
    """The fields of vLLM's ModelConfig that plugins read."""

    def __init__(self, settings):
        self.model = settings.get("model")
        self.served_model_name = settings.get("served_model_name")
        self.max_model_len = settings.get("max_model_len")
        self.embedding_size = settings.get("embedding_size")
        self.runner_type = "pooling"
        self.io_processor_plugin = settings.get("io_processor_plugin")
        self.architecture = settings.get("architecture")
        self.architectures = [self.architecture] if self.architecture else []
        self._hidden_size = settings.get("hidden_size")
        self.pooler_config = PoolerConfig(settings.get("pooler_config") or {})
        config = {}
        if self.model and os.path.isfile(os.path.join(self.model, "config.json")):
            with open(os.path.join(self.model, "config.json")) as f:
                config = json.load(f)
        self.hf_config = self.hf_text_config = _Attributes(config)

    def get_hidden_size(self):
        return self._hidden_size or self.hf_config.get("hidden_size")


class VllmConfig:
    def __init__(self, settings):
        self.model_config = ModelConfig(settings)


def _ask(method, **args):
    """One question to the server's tokenizer over the pipe (docs/plugins.md "The protocol")."""
    inbound, outbound = _CHANNEL
    write_frame(outbound, {"call": "tokenizer", "method": method, **args})
    header, _ = read_frame(inbound)
    if header is None:
        raise RuntimeError("the server closed the pipe")
    if not header.get("ok"):
        raise ValueError(header.get("message") or "the server's tokenizer refused the call")
    return header["result"]


class Tokenizer:
    """The server's tokenizer, the one the model runs on, with transformers' names: its special
    tokens as attributes (told at start), `encode`, `decode`, `convert_ids_to_tokens`,
    `convert_tokens_to_ids` and calling it, each one question over the pipe. No Python
    tokenizer package is needed."""

    def __init__(self, described):
        for name, value in (described.get("special") or {}).items():
            setattr(self, name, value)
        self.vocab_size = described.get("vocab_size")
        self.model_max_length = described.get("model_max_length")
        self.leading_space_marker = described.get("leading_space_marker")
        special = described.get("special") or {}
        roles = sorted(k[:-len("_token")] for k, t in special.items() if k.endswith("_token") and t)
        self.all_special_tokens = [special[f"{role}_token"] for role in roles]
        self.all_special_ids = [special.get(f"{role}_token_id") for role in roles]

    def __len__(self):
        return self.vocab_size

    def encode(self, text, add_special_tokens=True, **unused):
        return _ask("encode", text=text, add_special_tokens=bool(add_special_tokens))

    def __call__(self, text, add_special_tokens=True, **unused):
        if isinstance(text, (list, tuple)):
            ids = [self.encode(t, add_special_tokens) for t in text]
            return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}
        ids = self.encode(text, add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def decode(self, ids, skip_special_tokens=False, **unused):
        if isinstance(ids, int):
            ids = [ids]
        return _ask("decode", ids=[int(i) for i in ids], skip_special_tokens=bool(skip_special_tokens))

    def batch_decode(self, sequences, skip_special_tokens=False, **unused):
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        if isinstance(ids, int):
            return _ask("ids_to_tokens", ids=[ids])[0]
        tokens = _ask("ids_to_tokens", ids=[int(i) for i in ids])
        if skip_special_tokens:
            special = set(self.all_special_tokens)
            tokens = [t for t in tokens if t not in special]
        return tokens

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            found = _ask("tokens_to_ids", tokens=[tokens])[0]
            return self.unk_token_id if found is None else found
        return [self.unk_token_id if i is None else i for i in _ask("tokens_to_ids", tokens=list(tokens))]

    def decode_each(self, ids):
        """Each id decoded alone, in one question."""
        return _ask("decode_each", ids=[int(i) for i in ids])


def convert_ids_list_to_tokens(tokenizer, token_ids):
    """vLLM 0.33's helper: each id decoded alone, with the leading space a SentencePiece
    marker stands for restored (decode() strips it)."""
    token_ids = list(token_ids)
    if not token_ids:
        return []
    if isinstance(tokenizer, Tokenizer):
        decoded, marker = tokenizer.decode_each(token_ids), tokenizer.leading_space_marker
    else:
        decoded, marker = [tokenizer.decode([i]) for i in token_ids], None
    decoded = [text or "" for text in decoded]
    if marker is None:
        return decoded
    restored = []
    for raw, text in zip(tokenizer.convert_ids_to_tokens(token_ids), decoded):
        markers = len(raw or "") - len((raw or "").lstrip(marker))
        missing = markers - (len(text) - len(text.lstrip(" ")))
        restored.append(" " * missing + text if missing > 0 else text)
    return restored


class BaseRenderer:
    """vLLM's renderer as plugins use it: `get_tokenizer()` is the server's tokenizer."""

    def __init__(self, described):
        self._described, self._tokenizer = described, None

    def get_tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self._described or {})
        return self._tokenizer

    @property
    def tokenizer(self):
        return self.get_tokenizer()


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


def _request_mixins():
    """vLLM 0.33's request mixins (vllm.entrypoints.pooling.base.protocol) that plugins' request
    types extend, when pydantic is installed: unknown fields allowed, as OpenAIBaseModel does."""
    try:
        from typing import Literal
        import pydantic
    except ImportError:
        return {}

    class OpenAIBaseModel(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")

    class CompletionRequestMixin(OpenAIBaseModel):
        input: list[int] | list[list[int]] | str | list[str]
        add_special_tokens: bool = True

    class EncodingRequestMixin(OpenAIBaseModel):
        encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
        embed_dtype: str = "float32"
        endianness: Literal["native", "big", "little"] = "native"

    class EmbedRequestMixin(EncodingRequestMixin):
        dimensions: int | None = None
        use_activation: bool | None = None

    class ClassifyRequestMixin(OpenAIBaseModel):
        use_activation: bool | None = None

    return {cls.__name__: cls for cls in (OpenAIBaseModel, CompletionRequestMixin, EncodingRequestMixin,
                                          EmbedRequestMixin, ClassifyRequestMixin)}


# What `poolserve_plugins` offers: vLLM's names that plugins import, from wherever vLLM keeps them
# (vllm.config, vllm.inputs, vllm.outputs, vllm.pooling_params, vllm.renderers,
# vllm.plugins.io_processors.interface, vllm.entrypoints.serve.engine.protocol,
# vllm.entrypoints.pooling.base.protocol, vllm.tokenizers.detokenizer_utils,
# vllm.utils.collection_utils, vllm.logger).
OFFERED = ("IOProcessor", "IOProcessorInput", "IOProcessorOutput", "PoolingParams", "PoolingOutput", "PoolingRequestOutput",
           "UsageInfo", "TokensPrompt", "TextPrompt", "PromptType", "is_list_of", "init_logger", "VllmConfig", "ModelConfig",
           "PoolerConfig", "BaseRenderer", "convert_ids_list_to_tokens", "Matrix")


def _as_module():
    """This file's names as the module `poolserve_plugins` that plugins import."""
    module = types.ModuleType("poolserve_plugins")
    for name in OFFERED:
        setattr(module, name, globals()[name])
    for name, cls in _request_mixins().items():
        setattr(module, name, cls)
    sys.modules["poolserve_plugins"] = module
    return module


def missing_piece(name, error):
    """The start failure's message when the plugin needs what the host does not offer."""
    if isinstance(error, ImportError) and error.name == "poolserve_plugins" or (
            isinstance(error, ImportError) and "poolserve_plugins" in str(error)):
        offered = sorted(n for n in dir(sys.modules["poolserve_plugins"]) if not n.startswith("_"))
        return (f"plugin '{name}' imports a name poolserve does not offer ({error}); poolserve_plugins offers: "
                + ", ".join(offered))
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == "vllm":
        return (f"plugin '{name}' imports vLLM itself ({error.name}): poolserve runs vLLM's plugins with their "
                "`vllm.*` imports changed to `poolserve_plugins` (docs/plugins.md)")
    if isinstance(error, ModuleNotFoundError):
        return f"plugin '{name}' needs the Python package '{error.name}', which --plugin-python does not have"
    return None


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
    return cls(VllmConfig(settings), BaseRenderer(settings.get("tokenizer"))), sorted(found)


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


def params_of(params):
    """What the server reads of `merge_pooling_params()`'s answer (a PoolingParams, or any
    object with those attributes)."""
    if params is None:
        return {"task": None}
    if isinstance(params, PoolingParams):
        return params.sent()
    return {key: getattr(params, key, None) for key in PoolingParams.SENT}


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
                reply = {"ok": True, "prompts": [prompt_of(p) for p in prompts], "params": params_of(params)}
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
    global _CHANNEL
    _CHANNEL = (inbound, outbound)
    _as_module()
    header, _ = read_frame(inbound)
    limit = header.get("memory_limit_bytes")
    if limit:
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        processor, names = load(header["plugin"], header["paths"], header["model"])
        # The task and parameters the plugin will ask for, which the server checks against the
        # model before it serves.
        params = params_of(processor.merge_pooling_params()) if processor is not None else None
    except BaseException as error:
        traceback.print_exc(file=sys.stderr)
        message = missing_piece(header["plugin"], error) or f"{type(error).__name__}: {error}"
        write_frame(outbound, {"ok": False, "status": 500, "message": message})
        return
    if processor is None:
        write_frame(outbound, {"ok": False, "status": 404, "plugins": names})
        return
    write_frame(outbound, {"ok": True, "plugins": names, "pid": os.getpid(), "params": params})
    serve(processor, inbound, outbound)


main()
