"""Loading Hugging Face checkpoints: sharded and single files, and every way a checkpoint can
be broken (each a CheckpointError naming the file and the tensor, with nothing left behind)."""
import gc
import json
import struct

import pytest
import torch

import grout
from grout import weights

from conftest import SPECS


def load(path, **kw):
    return grout.load(path, device="cpu", dtype="float32", max_seq_len=16, progress=False, **kw)


def test_a_sharded_checkpoint_loads_from_its_index(checkpoints, engines):
    path, _ = checkpoints["untied"]
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("model-*.safetensors"))) > 2
    cfg = engines["untied"].config
    assert (cfg.head_dim, cfg.group, cfg.tie_word_embeddings) == (128, 3, False)


def test_the_config_follows_config_json(engines):
    spec = SPECS["tied"]
    cfg = engines["tied"].config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.vocab_size, cfg.tie_word_embeddings) == (
        spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"],
        spec["head_dim"], spec["vocab_size"], True)
    assert cfg.rope_theta == 10_000.0 and cfg.dtype == "float32"
    assert engines["untied"].config.rope_theta == 1_000_000.0


def test_dtype_none_is_the_checkpoint_dtype(checkpoints):
    eng = grout.load(checkpoints["tied"][0], device="cpu", max_seq_len=8, progress=False)
    assert eng.dtype == "float32"


def _as_float64(directory):
    """The checkpoint saved in float64: its tensors F64, config.json's torch_dtype float64."""
    from safetensors.torch import load_file, save_file
    path = directory / "model.safetensors"
    tensors = {k: t.double() for k, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    _edit_config(directory, dtype=None, torch_dtype="float64")


def test_an_explicit_dtype_loads_a_checkpoint_of_a_dtype_grout_does_not_compute_in(
        checkpoint_copy, engines):
    _as_float64(checkpoint_copy)
    eng = load(checkpoint_copy)                        # dtype="float32"
    assert eng.dtype == "float32" and eng.config.dtype == "float32"
    ids = [1, 2, 3, 4]
    assert torch.equal(eng.logits(ids), engines["tied"].logits(ids))


@pytest.mark.parametrize("dtype", [None, "auto"])
def test_a_checkpoint_dtype_grout_does_not_compute_in_needs_an_explicit_dtype(
        checkpoint_copy, no_new_holds, dtype):
    _as_float64(checkpoint_copy)
    with pytest.raises(grout.GroutError, match=r"config\.json: dtype 'float64' is not one grout "
                                               r"computes in .*pass .*dtype=\"float32\""):
        grout.load(checkpoint_copy, device="cpu", dtype=dtype, max_seq_len=16, progress=False)


def test_generation_config_eos_ids_stop_generation(checkpoint_copy, engines):
    first = engines["tied"].generate([1, 2, 3], max_new_tokens=4).token_ids
    (checkpoint_copy / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [first[2]]}))
    c = load(checkpoint_copy).generate([1, 2, 3], max_new_tokens=4)
    assert c.token_ids == first[:first.index(first[2]) + 1] and c.finish_reason == "stop"


def test_generation_config_sampling_settings_are_read_as_serving_defaults(checkpoint_copy):
    from grout.config import from_checkpoint
    (checkpoint_copy / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": None}))
    assert from_checkpoint(checkpoint_copy).sampling_defaults == (
        ("temperature", 0.6), ("top_k", 20), ("top_p", 0.95))


def test_a_null_sampling_setting_in_generation_config_is_no_default(checkpoint_copy):
    from grout.config import from_checkpoint
    (checkpoint_copy / "generation_config.json").write_text(json.dumps(
        {"temperature": None, "top_p": 0.5}))
    assert from_checkpoint(checkpoint_copy).sampling_defaults == (("top_p", 0.5),)


def test_named_shapes_have_no_sampling_defaults():
    assert all(cfg.sampling_defaults == () for cfg in grout.SHAPES.values())


@pytest.mark.parametrize("key, value", [("temperature", -0.5), ("temperature", "hot"),
                                        ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                        ("top_k", 2.5), ("top_k", True),
                                        ("temperature", 10 ** 400)])
def test_a_sampling_setting_no_request_could_send_is_a_checkpoint_error(checkpoint_copy, key,
                                                                        value):
    from grout.config import from_checkpoint
    (checkpoint_copy / "generation_config.json").write_text(json.dumps({key: value}))
    with pytest.raises(grout.CheckpointError, match=f"generation_config.json: {key} must"):
        from_checkpoint(checkpoint_copy)


def _rewrite_header(path, edit):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def test_a_missing_config_names_the_file(checkpoint_copy, no_new_holds):
    (checkpoint_copy / "config.json").unlink()
    with pytest.raises(grout.CheckpointError, match=r"config\.json: missing"):
        load(checkpoint_copy)


def test_another_architecture_is_rejected(checkpoint_copy, no_new_holds):
    cfg = json.loads((checkpoint_copy / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (checkpoint_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(grout.CheckpointError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        load(checkpoint_copy)


def test_rope_scaling_is_rejected(checkpoint_copy):
    cfg = json.loads((checkpoint_copy / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
    (checkpoint_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(grout.CheckpointError, match="yarn"):
        load(checkpoint_copy)


def test_rope_scaling_beside_default_rope_parameters_is_rejected(checkpoint_copy):
    cfg = json.loads((checkpoint_copy / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "default"     # as transformers 5 saves it
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 32768}
    (checkpoint_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(grout.CheckpointError, match=r"config\.json: rope scaling 'yarn'"):
        load(checkpoint_copy)


def _edit_config(directory, **fields):
    """config.json with ``fields`` set (None: removed); json.dumps writes NaN as NaN, as a
    hand-edited config.json might hold it."""
    cfg = json.loads((directory / "config.json").read_text())
    for key, value in fields.items():
        cfg.pop(key, None)
        if value is not None:
            cfg[key] = value
    (directory / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("fields, field", [
    (dict(rope_parameters={"rope_type": "default", "rope_theta": float("nan")}), "rope_theta"),
    (dict(rope_parameters=None, rope_theta=-1.0), "rope_theta"),
    (dict(rope_parameters=None, rope_theta="abc"), "rope_theta"),
    (dict(rope_parameters=None, rope_scaling="yarn"), "rope_scaling"),
    (dict(rope_parameters="default"), "rope_parameters"),
    (dict(architectures=5), "architectures"),
    (dict(num_attention_heads=0, head_dim=None), "num_attention_heads"),
    (dict(hidden_size="64", head_dim=None), "hidden_size"),
    (dict(rms_norm_eps="x"), "rms_norm_eps"),
    (dict(rms_norm_eps=float("inf")), "rms_norm_eps"),
    (dict(rms_norm_eps=10 ** 400), "rms_norm_eps"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings"),
], ids=["theta NaN", "theta negative", "theta text", "rope_scaling text", "rope_parameters text",
        "architectures int", "zero heads", "hidden_size text", "eps text", "eps infinite", "eps past float",
        "tied text"])
def test_a_bad_config_value_names_the_file_and_field(checkpoint_copy, no_new_holds, fields, field):
    _edit_config(checkpoint_copy, **fields)
    with pytest.raises(grout.CheckpointError, match=rf"config\.json: .*{field}"):
        load(checkpoint_copy)


def test_a_null_tie_word_embeddings_means_untied(checkpoint_copy):
    from grout.config import from_dict
    raw = json.loads((checkpoint_copy / "config.json").read_text())
    raw["tie_word_embeddings"] = None
    assert from_dict(raw, "config.json").tie_word_embeddings is False


def test_a_null_num_key_value_heads_means_one_per_query_head_as_in_transformers(checkpoint_copy):
    from grout.config import from_dict
    raw = json.loads((checkpoint_copy / "config.json").read_text())
    raw["num_key_value_heads"] = None
    assert from_dict(raw, "config.json").num_key_value_heads == raw["num_attention_heads"]


@pytest.mark.parametrize("key", ["head_dim", "num_key_value_heads", "max_position_embeddings",
                                 "rope_theta"])
def test_a_key_left_out_of_config_json_reads_as_transformers_reads_it(checkpoint_copy, key):
    from transformers import AutoConfig
    from grout.config import from_checkpoint
    raw = json.loads((checkpoint_copy / "config.json").read_text())
    raw.update(num_attention_heads=64, hidden_size=64)   # 32 kv heads divide 64 query heads
    for k in (key, "rope_parameters") if key == "rope_theta" else (key,):
        raw.pop(k, None)
    (checkpoint_copy / "config.json").write_text(json.dumps(raw))
    theirs = AutoConfig.from_pretrained(checkpoint_copy)
    expected = theirs.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(theirs, key)
    assert getattr(from_checkpoint(checkpoint_copy), key) == expected


@pytest.mark.parametrize("fields", [dict(max_position_embeddings=None), dict(rms_norm_eps=None),
                                    dict(head_dim=None)],
                         ids=["max_position_embeddings", "rms_norm_eps", "head_dim"])
def test_a_null_that_transformers_refuses_is_refused_naming_the_field(checkpoint_copy, fields):
    from grout.config import from_dict
    raw = dict(json.loads((checkpoint_copy / "config.json").read_text()), **fields)
    with pytest.raises(grout.CheckpointError, match=rf"config\.json: {next(iter(fields))}"):
        from_dict(raw, "config.json")


@pytest.mark.parametrize("file", ["config.json", "generation_config.json"])
def test_an_eos_token_id_that_is_not_a_token_id_names_the_file_and_field(checkpoint_copy, file):
    path = checkpoint_copy / file
    data = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(dict(data, eos_token_id="x")))
    with pytest.raises(grout.CheckpointError, match=rf"{file}: eos_token_id must be a token id"):
        load(checkpoint_copy)


def test_a_quantized_checkpoint_is_refused_naming_its_method(checkpoint_copy):
    path = checkpoint_copy / "config.json"
    raw = dict(json.loads(path.read_text()), quantization_config={"quant_method": "fp8"})
    path.write_text(json.dumps(raw))
    with pytest.raises(grout.CheckpointError, match=r"quantization_config \('fp8'\): quantized"):
        load(checkpoint_copy)


@pytest.mark.parametrize("eos", [-1, [151645, -2]])
def test_a_negative_eos_token_id_is_refused_naming_the_file(checkpoint_copy, eos):
    path = checkpoint_copy / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), eos_token_id=eos)))
    with pytest.raises(grout.CheckpointError, match=r"config\.json: eos_token_id must be a token "
                                                    r"id \(an int >= 0\)"):
        load(checkpoint_copy)


@pytest.mark.parametrize("shard", ["/etc/passwd", "../model.safetensors", "sub/../../x",
                                   "model\u0000.safetensors"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused_before_opening_it(
        checkpoints, tmp_path, shard):
    import shutil
    path = tmp_path / "sharded"
    shutil.copytree(checkpoints["untied"][0], path)
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name = next(iter(data["weight_map"]))
    data["weight_map"][name] = shard
    index.write_text(json.dumps(data))
    with pytest.raises(grout.CheckpointError, match=rf"weight_map names .* for '{name}': a "
                                                    r"shard is named by a path inside"):
        load(path)


@pytest.mark.parametrize("entry", [dict(shape="abc"), dict(shape=[-64]), dict(shape=[64.0]),
                                   dict(dtype=["F32"])], ids=["text", "negative", "float",
                                                              "dtype list"])
def test_a_corrupt_header_entry_names_the_file_and_tensor(checkpoint_copy, no_new_holds, entry):
    _rewrite_header(checkpoint_copy / "model.safetensors",
                    lambda h: h["model.norm.weight"].update(entry))
    with pytest.raises(grout.CheckpointError,
                       match=r"model\.safetensors: tensor 'model\.norm\.weight'"):
        load(checkpoint_copy)


def test_a_truncated_safetensors_file_names_the_file_and_tensor(checkpoint_copy, no_new_holds):
    f = checkpoint_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) - 1000])
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: truncated: tensor "):
        load(checkpoint_copy)


def test_a_corrupt_header_is_a_checkpoint_error(checkpoint_copy, no_new_holds):
    f = checkpoint_copy / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:16] = b"\x00garbage"
    f.write_bytes(bytes(data))
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: corrupt"):
        load(checkpoint_copy)
    f.write_bytes(b"abc")
    with pytest.raises(grout.CheckpointError, match="truncated"):
        load(checkpoint_copy)


def test_a_shape_that_disagrees_with_config_json(checkpoint_copy, no_new_holds):
    cfg = json.loads((checkpoint_copy / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (checkpoint_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(grout.CheckpointError,
                       match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj"
                             r"\.weight' has shape \[\d+, \d+\], config\.json implies"):
        load(checkpoint_copy)


def test_a_missing_tensor_is_named(checkpoint_copy, no_new_holds):
    from safetensors.torch import load_file, save_file
    name = "model.layers.1.self_attn.k_norm.weight"
    f = checkpoint_copy / "model.safetensors"
    tensors = load_file(f)
    del tensors[name]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(grout.CheckpointError, match=rf"tensor '{name}' is missing"):
        load(checkpoint_copy)


def test_untied_config_without_an_lm_head(checkpoint_copy, no_new_holds):
    cfg = json.loads((checkpoint_copy / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (checkpoint_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(grout.CheckpointError, match="'lm_head.weight' is missing"):
        load(checkpoint_copy)


def test_a_missing_shard_is_named(checkpoints, tmp_path, no_new_holds):
    import shutil
    src, _ = checkpoints["untied"]
    shutil.copytree(src, tmp_path / "m")
    victim = sorted((tmp_path / "m").glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(grout.CheckpointError, match=f"{victim.name}: missing"):
        load(tmp_path / "m")


def test_a_bad_tensor_offset_is_caught_before_reading(checkpoint_copy, no_new_holds):
    def shift(h):
        h["model.norm.weight"]["data_offsets"][1] += 4
    _rewrite_header(checkpoint_copy / "model.safetensors", shift)
    with pytest.raises(grout.CheckpointError, match="'model.norm.weight': data offsets"):
        load(checkpoint_copy)


@pytest.fixture
def arenas(monkeypatch):
    """A weak reference to the storage of every weight arena allocated meanwhile."""
    from torch.multiprocessing.reductions import StorageWeakRef
    made = []
    init = weights.Arena.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(StorageWeakRef(self.buf.untyped_storage()))
    monkeypatch.setattr(weights.Arena, "__init__", spy)
    return made


def _by_offset(header):
    return sorted((n for n in header if n != "__metadata__"),
                  key=lambda n: header[n]["data_offsets"])


def test_stray_bytes_after_the_last_tensor_are_refused_before_anything_is_allocated(
        checkpoint_copy, no_new_holds, arenas):
    with open(checkpoint_copy / "model.safetensors", "ab") as f:
        f.write(b"XXXXXXXX")
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: corrupt: 8 stray "
                                                    r"bytes \[\d+, \d+\) follow the last "
                                                    r"tensor, '[\w.]+'"):
        load(checkpoint_copy)
    assert arenas == []


def test_a_gap_between_tensors_is_refused_naming_the_tensor_after_it(checkpoint_copy,
                                                                     no_new_holds, arenas):
    f = checkpoint_copy / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    before, after = _by_offset(header)[-2:]
    begin = header[after]["data_offsets"][0]
    header[after]["data_offsets"] = [o + 64 for o in header[after]["data_offsets"]]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    body = data[8 + n:]
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + body[:begin] + bytes(64) + body[begin:])
    start = 8 + len(raw) + begin
    with pytest.raises(grout.CheckpointError) as info:
        load(checkpoint_copy)
    assert str(info.value).startswith(
        f"{f}: corrupt: bytes [{start}, {start + 64}) lie between tensor '{before}' and tensor "
        f"'{after}' and belong to no tensor")
    assert arenas == []


def test_overlapping_tensors_are_refused_naming_both_before_anything_is_allocated(
        checkpoint_copy, no_new_holds, arenas):
    names = []

    def overlap(h):             # the second tensor begins 4 bytes inside the first
        names.extend(_by_offset(h)[:2])
        h[names[1]]["data_offsets"] = [o - 4 for o in h[names[1]]["data_offsets"]]
    _rewrite_header(checkpoint_copy / "model.safetensors", overlap)
    with pytest.raises(grout.CheckpointError,
                       match=rf"model\.safetensors: corrupt: tensor '{names[1]}' \(bytes "
                             rf"\[\d+, \d+\)\) overlaps tensor '{names[0]}' \(bytes"):
        load(checkpoint_copy)
    assert arenas == []


def test_a_file_the_safetensors_reader_refuses_is_refused_before_anything_is_allocated(
        checkpoint_copy, no_new_holds, arenas):
    # a tensor grout does not read, of a dtype safetensors does not know (and of no bytes,
    # so the data section is still covered exactly)
    def extra(h):
        end = h[_by_offset(h)[-1]]["data_offsets"][1]
        h["extra"] = {"dtype": "NOPE", "shape": [0], "data_offsets": [end, end]}
    _rewrite_header(checkpoint_copy / "model.safetensors", extra)
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: the safetensors "
                                                    r"reader refuses the file \(.*NOPE"):
        load(checkpoint_copy)
    assert arenas == []


def test_an_error_reading_the_weights_keeps_nothing_allocated_through_its_traceback(
        checkpoint_copy, no_new_holds, arenas, monkeypatch):
    class Failing:                     # a file that fails partway through (a disk error)
        def __init__(self, handle):
            self.handle = handle

        def get_tensor(self, name):
            if name.startswith("model.layers.1."):
                raise OSError(5, "Input/output error")
            return self.handle.get_tensor(name)
    import safetensors
    safe_open = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: Failing(safe_open(*a, **k)))
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: reading tensor "
                                                    r"'model\.layers\.1\.[\w.]+' failed") as info:
        load(checkpoint_copy)
    gc.collect()
    assert info.value.__traceback__ is not None         # the error is still held, and yet
    assert len(arenas) == 1 and arenas[0].expired()


def test_copying_a_tensor_without_data_is_a_checkpoint_error_that_keeps_nothing_allocated(
        checkpoints, no_new_holds, arenas):
    from grout.engine import from_tensors
    _, model = checkpoints["tied"]
    cfg = grout.config.from_dict(model.config.to_dict(), "config", name="tied")
    tensors = dict(model.state_dict())
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = torch.empty(tensors[name].shape, device="meta")
    with pytest.raises(grout.CheckpointError, match=rf"from_tensors: copying tensor '{name}' "
                                                    r"failed") as info:
        from_tensors(cfg, tensors, device="cpu", dtype="float32")
    gc.collect()
    assert info.value.__traceback__ is not None         # the error is still held, and yet
    assert len(arenas) == 1 and arenas[0].expired()


def test_a_failed_load_leaves_the_callers_own_error_and_its_locals_alone(checkpoints,
                                                                            no_new_holds):
    from grout.engine import from_tensors
    _, model = checkpoints["tied"]
    cfg = grout.config.from_dict(model.config.to_dict(), "config", name="tied")
    tensors = dict(model.state_dict())
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = torch.empty(tensors[name].shape, device="meta")

    def callers_step():
        state = {"the caller's": "locals"}
        raise KeyError(state)
    try:
        callers_step()
    except KeyError as own:
        callers = own
        with pytest.raises(grout.CheckpointError):
            from_tensors(cfg, tensors, device="cpu", dtype="float32")
    tb = callers.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_locals == {"state": {"the caller's": "locals"}}


def test_an_engine_that_fails_to_start_keeps_no_weights_alive_through_its_traceback(
        checkpoints, no_new_holds, arenas, monkeypatch):
    import grout.engine

    class Failing(grout.engine.Runner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            raise RuntimeError("out of memory")
    monkeypatch.setattr(grout.engine, "Runner", Failing)
    with pytest.raises(RuntimeError, match="out of memory") as info:
        load(checkpoints["tied"][0])
    gc.collect()
    assert info.value.__traceback__ is not None         # the error is still held, and yet
    assert len(arenas) == 2 and all(a.expired() for a in arenas)   # the weights, the buffers


def test_a_nonexistent_directory_and_an_unknown_shape(no_new_holds):
    with pytest.raises(grout.CheckpointError, match="no such checkpoint directory"):
        grout.load("./no/such/dir", device="cpu")
    with pytest.raises(grout.RequestError, match="unknown model 'qwen9-1b'.*tiny"):
        grout.load("qwen9-1b", device="cpu")


def test_a_file_of_a_checkpoint_is_told_to_pass_its_directory(checkpoints, no_new_holds):
    path, _ = checkpoints["tied"]
    with pytest.raises(grout.CheckpointError, match=r"model\.safetensors: a file, not a "
                                                   r"checkpoint directory; pass the directory"):
        load(path / "model.safetensors")


def test_a_hub_model_id_is_told_grout_loads_local_files_only(no_new_holds):
    with pytest.raises(grout.CheckpointError, match=r"Qwen/Qwen3-0.6B: no such checkpoint "
                                                   r"directory \(grout loads local files only"):
        load("Qwen/Qwen3-0.6B")


def test_errors_are_value_errors():
    assert issubclass(grout.CheckpointError, grout.GroutError)
    assert issubclass(grout.RequestError, grout.GroutError)
    assert issubclass(grout.GroutError, ValueError)


def test_weights_are_shared_on_the_device_and_released_with_the_engine(checkpoints):
    import gc
    from safetile.tensor import active_holds
    gc.collect()
    before = len(active_holds())
    eng = load(checkpoints["tied"][0])
    assert len(active_holds()) > before          # every weight holds its read borrow
    w = eng.runner.w
    assert w.lm_head.w.shape == w.embed.shape    # tied: the embedding's storage
    assert torch.equal(w.lm_head.w.to_torch(), w.embed.to_torch())
    del eng, w
    gc.collect()
    assert len(active_holds()) == before


def test_a_config_error_names_the_file_once_without_a_model_name():
    from grout import config
    raw = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
           "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 3,
           "num_key_value_heads": 2, "head_dim": 16}
    with pytest.raises(grout.CheckpointError) as e:
        config.from_dict(raw, "/p/config.json", name="")
    assert str(e.value) == ("/p/config.json: num_attention_heads 3 is not a multiple of "
                            "num_key_value_heads 2")


def test_a_kv_cache_too_large_to_allocate_is_a_request_error_naming_max_seq_len(
        checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["max_position_embeddings"] = 2**62
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(grout.RequestError, match="KV cache for max_seq_len=1152921504606846976"):
        grout.load(checkpoint_copy, device="cpu", dtype="float32", max_seq_len=2**60,
                   progress=False)
