"""The framework checks that run/automodel/rules.cpp's refusals cite (issue 50), each reached by the
smallest call that gets to it at the installed release (nemo-automodel 0.7.0, transformers 5.18.0,
torch 2.11) and asserted to raise as the refusal says, at the file:line it names. Where a refusal
says tally's worker does not build a case and cites a fact of the framework's, the fact is checked
too. The calls that need torch.distributed run once, on two CPU ranks over gloo (one spawn for the
module); the rest in this process. Run by ci/real-automodel in Automodel's venv."""

import os
import tempfile
import traceback

import pytest

pytest.importorskip("nemo_automodel")

WORLD = 2


def raised_at(frames, path, line):
    """Whether the innermost frame of `frames` ((filename, lineno), outermost first) in a file ending
    with `path` is at `line`: where that file raised."""
    lines = [n for f, n in frames if f.replace(os.sep, "/").endswith(path)]
    return bool(lines) and lines[-1] == line


def passes_through(frames, path, line):
    """Whether a frame of `frames` in a file ending with `path` is at `line`."""
    return any(f.replace(os.sep, "/").endswith(path) and n == line for f, n in frames)


def caught(call):
    """(exception type name, message, frames) of what `call` raises; ("", "", []) when it returns."""
    try:
        call()
    except Exception as error:  # the check's own exception, whatever its type
        return type(error).__name__, str(error), [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]
    return "", "", []


def llama(heads, kv_heads, hidden, head_dim):
    """Automodel's own Llama (the class its registry names, as the worker builds it), fp32."""
    from nemo_automodel._transformers.registry import get_registry
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=8, hidden_size=hidden, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=16, tie_word_embeddings=False)
    return get_registry().get_model_cls_from_model_arch("LlamaForCausalLM")(config)


def parallelized(model, sequence_parallel=False, **sizes):
    """`model` through Automodel's MeshContext.build and parallelize_model, as the worker calls them."""
    import torch
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model
    from torch.distributed.fsdp import MixedPrecisionPolicy

    strategy = FSDP2Config(mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32),
                           sequence_parallel=sequence_parallel)
    context = MeshContext.build(strategy, ParallelismSizes(**sizes), world_size=WORLD)
    return context, parallelize_model(model, context)


def _distributed_checks():
    """What each distributed call does on this rank: name -> caught(...), or the mesh's axes."""
    out = {}
    out["kv_heads_over_tp"] = caught(lambda: parallelized(llama(heads=4, kv_heads=1, hidden=8, head_dim=2), tp_size=2))
    out["heads_over_tp"] = caught(lambda: parallelized(llama(heads=3, kv_heads=2, hidden=12, head_dim=4), tp_size=2))
    out["ep_without_experts"] = caught(lambda: parallelized(llama(heads=2, kv_heads=2, hidden=8, head_dim=4), ep_size=2))
    out["sequence_parallel_at_tp_1"] = caught(
        lambda: parallelized(llama(heads=2, kv_heads=2, hidden=8, head_dim=4), sequence_parallel=True, tp_size=1))
    context, _ = parallelized(llama(heads=2, kv_heads=2, hidden=8, head_dim=4), tp_size=2)
    out["mesh_axes"] = tuple(context.device_mesh.mesh_dim_names)
    out["uneven_dim_1"] = caught(_stacked_experts_sharded_along_dim_1)
    return out


def _stacked_experts_sharded_along_dim_1():
    """FSDP2 over two ranks of a stacked expert tensor whose dim 1 is 1, along dim 1 as Automodel's
    MoE parallelizer shards it (moe/parallelizer.py:112)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    module = torch.nn.Module()
    module.down_projs = torch.nn.Parameter(torch.zeros(2, 1, 4))
    fully_shard(module, mesh=init_device_mesh("cpu", (WORLD,)), shard_placement_fn=lambda p: Shard(1))


def _rank_main(rank, path, reports):
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
        try:
            reports.put((rank, _distributed_checks()))
        finally:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException as error:  # reported by the parent, with the rank
        reports.put((rank, f"{type(error).__name__}: {error}"))


@pytest.fixture(scope="module")
def on_two_ranks():
    """Rank 0's results of _distributed_checks on two gloo ranks (both ranks must agree)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    reports = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as folder:
        processes = [context.Process(target=_rank_main, args=(rank, os.path.join(folder, "store"), reports))
                     for rank in range(WORLD)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(180)
    results = {}
    while not reports.empty():
        rank, result = reports.get()
        results[rank] = result
    # Each rank's own report decides (torch 2.11's gloo may abort a process as it exits).
    assert sorted(results) == list(range(WORLD)), (results, [p.exitcode for p in processes])
    for rank, result in results.items():
        assert isinstance(result, dict), f"rank {rank}: {result}"
    for key, value in results[0].items():
        if key != "mesh_axes":
            assert {tuple(r[key][:2]) for r in results.values()} == {tuple(value[:2])}, key
    return results[0]


# --- (a) the framework's own checks -----------------------------------------------------------------


def test_llama_config_refuses_a_hidden_size_not_a_multiple_of_the_heads():
    """model.hidden_size with num_attention_heads: transformers/models/llama/configuration_llama.py:97, a
    ValueError that huggingface_hub's strict dataclass raises as StrictDataclassClassValidationError."""
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import LlamaConfig

    with pytest.raises(StrictDataclassClassValidationError) as raised:
        LlamaConfig(hidden_size=10, num_attention_heads=4, head_dim=4)
    cause = raised.value.__cause__
    assert isinstance(cause, ValueError)
    assert str(cause) == "The hidden size (10) is not a multiple of the number of attention heads (4)."
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(cause.__traceback__)]
    assert raised_at(frames, "transformers/models/llama/configuration_llama.py", 97)
    LlamaConfig(hidden_size=12, num_attention_heads=4, head_dim=4)  # a multiple: no refusal


def test_hsdp_degree_must_divide_dp():
    """automodel.dp_replicate not dividing DP: nemo_automodel/components/distributed/mesh_utils.py:309."""
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes

    kind, message, frames = caught(lambda: MeshContext.build(
        FSDP2Config(), ParallelismSizes(dp_replicate_size=3, tp_size=2), world_size=8))  # DP 4
    assert (kind, message) == ("ValueError", "dp_size must be a multiple of dp_replicate_size")
    assert raised_at(frames, "nemo_automodel/components/distributed/mesh_utils.py", 309)


def test_hsdp_degree_must_be_below_dp():
    """automodel.dp_replicate >= DP (above 1): nemo_automodel/components/distributed/mesh_utils.py:311."""
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes

    kind, message, frames = caught(lambda: MeshContext.build(
        FSDP2Config(), ParallelismSizes(dp_replicate_size=2, tp_size=2), world_size=4))  # DP 2
    assert (kind, message) == ("ValueError", "dp_replicate_size=2 must be less than dp_size=2 since DDP usecase is "
                                             "not supported by FSDP2")
    assert raised_at(frames, "nemo_automodel/components/distributed/mesh_utils.py", 311)


def test_tp_must_divide_the_key_value_heads(on_two_ranks):
    """topology.tp over model.num_query_groups: nemo_automodel/components/distributed/parallelizer.py:1040."""
    kind, message, frames = on_two_ranks["kv_heads_over_tp"]
    assert (kind, message) == ("ValueError", "num_key_value_heads (1) must be divisible by TP size (2)")
    assert raised_at(frames, "nemo_automodel/components/distributed/parallelizer.py", 1040)


def test_tp_must_divide_the_heads(on_two_ranks):
    """topology.tp over model.num_attention_heads: nemo_automodel/components/distributed/parallelizer.py:1042."""
    kind, message, frames = on_two_ranks["heads_over_tp"]
    assert (kind, message) == ("ValueError", "num_attention_heads (3) must be divisible by TP size (2)")
    assert raised_at(frames, "nemo_automodel/components/distributed/parallelizer.py", 1042)


def test_ep_on_a_dense_model_goes_to_the_moe_parallelizer_which_refuses_it(on_two_ranks):
    """topology.ep > 1 without experts: model_parallelizer.py:71, then components/moe/parallelizer.py:245."""
    kind, message, frames = on_two_ranks["ep_without_experts"]
    assert kind == "AttributeError"
    assert message.startswith("MoE models must expose moe_config")
    assert passes_through(frames, "nemo_automodel/components/distributed/model_parallelizer.py", 72)  # :71's branch
    assert raised_at(frames, "nemo_automodel/components/moe/parallelizer.py", 245)


# --- facts the "does not build" refusals cite ------------------------------------------------------


def test_sequence_parallelism_at_tp_1_runs_on_automodel(on_two_ranks):
    """automodel.sequence_parallel with topology.tp 1 is not Automodel's limit: it parallelizes the
    model, reading the flag only where TP > 1 (parallelizer.py:317)."""
    assert on_two_ranks["sequence_parallel_at_tp_1"] == ("", "", [])


def test_the_default_mesh_is_tp_fastest(on_two_ranks):
    """topology.order: the worker builds Automodel's default mesh (mesh_utils.py:324)."""
    assert on_two_ranks["mesh_axes"] == ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def test_automodels_qwen3_has_no_mlp_biases():
    """model.add_bias_linear with qk_layernorm: transformers/models/qwen3/modeling_qwen3.py:76."""
    from nemo_automodel._transformers.registry import get_registry
    from transformers import Qwen3Config

    config = Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=4, max_position_embeddings=16, attention_bias=True)
    model = get_registry().get_model_cls_from_model_arch("Qwen3ForCausalLM")(config)
    names = [n for n, _ in model.named_parameters()]
    assert "model.layers.0.self_attn.q_proj.bias" in names  # attention biases it has, where asked
    assert not [n for n in names if ".mlp." in n and n.endswith(".bias")]


def qwen3_moe(tied):
    """Automodel's own Qwen3-MoE (the class its registry names), as the worker builds it."""
    from nemo_automodel._transformers.registry import get_registry
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

    config = Qwen3MoeConfig(vocab_size=4, hidden_size=4, intermediate_size=4, moe_intermediate_size=2, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=2, num_experts=2, num_experts_per_tok=1,
                            max_position_embeddings=4, tie_word_embeddings=tied, dtype="float32")
    return get_registry().get_model_cls_from_model_arch("Qwen3MoeForCausalLM")(config)


def test_qwen3_moe_refuses_a_tied_output_layer():
    """model.untie_embeddings_and_output_weights false with experts:
    nemo_automodel/components/models/common/tie_word_embeddings.py:61."""
    name, message, frames = caught(lambda: qwen3_moe(tied=True))
    assert name == "NotImplementedError", (name, message)
    assert "does not support tie_word_embeddings=True" in message
    assert raised_at(frames, "nemo_automodel/components/models/common/tie_word_embeddings.py", 61)


def test_qwen3_moe_builds_its_rotary_embedding_on_cuda():
    """The worker's cannot_run reason for model.num_experts where it sees no GPU:
    nemo_automodel/components/models/qwen3_moe/model.py:184 asks torch.cuda for the current device."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: Qwen3-MoE builds here")
    name, message, frames = caught(lambda: qwen3_moe(tied=False))
    assert name == "RuntimeError", (name, message)
    assert passes_through(frames, "nemo_automodel/components/models/qwen3_moe/model.py", 184)
    assert raised_at(frames, "torch/cuda/__init__.py", frames[-1][1])


def gpt_oss_config(tied=False):
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig

    return GptOssConfig(vocab_size=4, hidden_size=4, intermediate_size=2, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=2, num_local_experts=2, num_experts_per_tok=1,
                        max_position_embeddings=4, tie_word_embeddings=tied, dtype="float32",
                        layer_types=["sliding_attention", "full_attention"])


def gpt_oss(tied=False):
    """Automodel's own GPT-OSS (the class its registry names), as the worker builds it."""
    from nemo_automodel._transformers.registry import get_registry

    return get_registry().get_model_cls_from_model_arch("GptOssForCausalLM")(gpt_oss_config(tied))


def cited_line(path, line):
    """The text of `line` of the installed Automodel's file `path` (under nemo_automodel/)."""
    import linecache

    import nemo_automodel

    return linecache.getline(os.path.join(os.path.dirname(nemo_automodel.__file__), path), line)


def test_gpt_oss_attention_always_has_sinks_and_biases():
    """model.softmax_type vanilla / model.add_bias_linear false with experts and without qk_layernorm:
    GPT-OSS's attention is built with a learnable sink per head (gpt_oss/layers.py:97) and q/k/v/o
    biases (layers.py:59-70), whatever its config says; its MoE with router and expert biases
    (model.py:129-130). The attention alone builds on CPUs."""
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.models.gpt_oss.layers import GptOssAttention

    config = gpt_oss_config()
    config.attention_bias = False  # what a user could set: the projections keep their biases
    attention = GptOssAttention(config, BackendConfig(attn="flex"))
    names = sorted(n for n, _ in attention.named_parameters())
    assert names == sorted(["sinks"] + [f"{p}_proj.{k}" for p in "qkvo" for k in ("weight", "bias")]), names
    assert "self.sinks = nn.Parameter" in cited_line("components/models/gpt_oss/layers.py", 97)
    assert all("bias=True" in cited_line("components/models/gpt_oss/layers.py", n) for n in (60, 63, 66, 69))
    assert "expert_bias=True" in cited_line("components/models/gpt_oss/model.py", 129)
    assert "router_bias=True" in cited_line("components/models/gpt_oss/model.py", 130)


def test_gpt_oss_builds_every_layer_as_moe():
    """model.moe_layer_freq with a dense layer in GPT-OSS: its Block always has a MoE (gpt_oss/model.py:54)."""
    assert "self.mlp = MoE(" in cited_line("components/models/gpt_oss/model.py", 54)


def test_gpt_oss_refuses_a_tied_output_layer():
    """model.untie_embeddings_and_output_weights false with experts: tie_word_embeddings.py:61."""
    name, message, frames = caught(lambda: gpt_oss(tied=True))
    assert name == "NotImplementedError", (name, message)
    assert raised_at(frames, "nemo_automodel/components/models/common/tie_word_embeddings.py", 61)


def test_gpt_oss_builds_its_rotary_embedding_on_cuda():
    """The worker's cannot_run reason for model.num_experts where it sees no GPU: gpt_oss/model.py:160."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: GPT-OSS builds here")
    name, message, frames = caught(lambda: gpt_oss(tied=False))
    assert name == "RuntimeError", (name, message)
    assert passes_through(frames, "nemo_automodel/components/models/gpt_oss/model.py", 160)


def test_deepseek_v3_builds_on_cpus_without_mtp_biases_or_a_dense_layer_after_moe():
    """DeepSeek-V3 (multi-latent attention) is the MoE model the worker runs without a GPU; what its
    refusals cite: no MTP layer though the config asks one, projections with bias=False
    (deepseek_v3/layers.py:85-128), the latent norms always there (:96, :114), dense exactly the first
    first_k_dense_replace layers (model.py:55), shared experts n_shared_experts experts wide (:152)."""
    from nemo_automodel._transformers.registry import get_registry
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config

    config = DeepseekV3Config(vocab_size=4, hidden_size=4, intermediate_size=4, moe_intermediate_size=2, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2, n_shared_experts=1,
                              num_experts_per_tok=1, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=4,
                              kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, num_nextn_predict_layers=1,
                              max_position_embeddings=4, tie_word_embeddings=False, dtype="float32")
    model = get_registry().get_model_cls_from_model_arch("DeepseekV3ForCausalLM")(config)
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if "mtp" in n or "nextn" in n or not n.startswith(("model.", "lm_head."))], names
    assert not [n for n in names if n.endswith(".bias")], names
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.1.mlp.experts.down_projs" in names
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in names
    layers = "components/models/deepseek_v3/layers.py"
    assert "self.q_a_layernorm = " in cited_line(layers, 96) and "self.kv_a_layernorm = " in cited_line(layers, 114)
    assert sum("bias=False" in cited_line(layers, n) for n in range(85, 129)) == 6  # q_proj or q_a, q_b; kv_a, kv_b; o
    assert "layer_idx >= config.first_k_dense_replace" in cited_line("components/models/deepseek_v3/model.py", 55)
    assert "n_shared_experts=config.n_shared_experts" in cited_line("components/models/deepseek_v3/model.py", 152)


def test_automodels_moe_tp_plan_may_not_shard_routed_experts():
    """topology.etp != 1 with experts: nemo_automodel/components/moe/tp_plan_validation.py:79."""
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.moe.tp_plan_validation import _validate_moe_tp_plan
    from torch.distributed.tensor.parallel import ColwiseParallel
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config

    config = DeepseekV3Config(vocab_size=4, hidden_size=4, intermediate_size=4, moe_intermediate_size=2, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2, n_shared_experts=1,
                              num_experts_per_tok=1, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=4,
                              kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                              max_position_embeddings=4, tie_word_embeddings=False, dtype="float32")
    model = get_registry().get_model_cls_from_model_arch("DeepseekV3ForCausalLM")(config)
    name, message, frames = caught(lambda: _validate_moe_tp_plan({"model.layers.*.mlp.experts": ColwiseParallel()}, model))
    assert name == "ValueError", (name, message)
    assert "must not target routed-expert parameters" in message
    assert raised_at(frames, "nemo_automodel/components/moe/tp_plan_validation.py", 79)


def test_fsdp2_refuses_an_uneven_shard_along_dim_1(on_two_ranks):
    """model.hidden_size or moe_ffn_hidden_size that ep_shard does not divide:
    torch/distributed/fsdp/_fully_shard/_fsdp_param.py:377 at torch 2.11.0."""
    name, message, frames = on_two_ranks["uneven_dim_1"]
    assert name == "NotImplementedError", (name, message)
    assert message.startswith("FSDP does not support uneven sharding on dim 1")
    assert raised_at(frames, "torch/distributed/fsdp/_fully_shard/_fsdp_param.py", 377)
