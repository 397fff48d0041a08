"""The checks of transformers and accelerate that run/hf/rules.cpp's refusals cite, each reached by the
smallest call that gets to it at the installed releases (transformers 5.17.0, accelerate 1.15.0,
torch 2.11) and asserted to raise as the refusal says, at the file:line it names. Where a refusal
says tally's worker does not build a case and cites a fact of the stack's, the fact is checked too.
The calls that need torch.distributed run once, on two CPU ranks over gloo (one spawn for the
module); the rest in this process. Run by ci/real-hf in its venv."""

import linecache
import os
import tempfile
import traceback
import types

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

WORLD = 2


def raised_at(frames, path, line):
    """Whether the innermost frame of `frames` ((filename, lineno), outermost first) in a file ending
    with `path` is at `line`: where that file raised."""
    lines = [n for f, n in frames if f.replace(os.sep, "/").endswith(path)]
    return bool(lines) and lines[-1] == line


def caught(call):
    """(exception type name, message, frames) of what `call` raises; ("", "", []) when it returns."""
    try:
        call()
    except Exception as error:  # the check's own exception, whatever its type
        return type(error).__name__, str(error), [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]
    return "", "", []


def source_line(module, line):
    """Line `line` of `module`'s source file, stripped."""
    return linecache.getline(module.__file__, line).strip()


def llama(vocab=8, tied=False):
    """transformers' own Llama, fp32, as the worker builds it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=16,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def tensor_parallel(model):
    """`model` distributed by transformers' TP plan over a tp mesh of the world, as the worker calls it
    (the two steps from_pretrained runs around the model's init)."""
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    mesh = dist.device_mesh.init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    distributed, _, tp_mesh = type(model).prepare_distribute_model(DistributedConfig(tp_size=WORLD), device_mesh=mesh)
    return type(model).maybe_distribute_model(model, distributed, tp_mesh)


def mixtral(experts):
    """transformers' own Mixtral, fp32, as the worker builds a case with experts and no qk-layernorm."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=8, hidden_size=8, intermediate_size=4, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=16,
                           num_local_experts=experts, num_experts_per_tok=1, tie_word_embeddings=False)
    return MixtralForCausalLM(config)


def expert_parallel(model):
    """`model` distributed by transformers' EP over a mesh of the world, as the worker calls it."""
    import torch.distributed as dist
    from transformers.distributed import DistributedConfig

    mesh = dist.device_mesh.init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    distributed, _, tp_mesh = type(model).prepare_distribute_model(
        DistributedConfig(tp_size=WORLD, enable_expert_parallel=True), device_mesh=mesh)
    return type(model).maybe_distribute_model(model, distributed, tp_mesh)


def _distributed_checks():
    """What each distributed call does on this rank: name -> caught(...), or a fact."""
    out = {}
    out["experts_over_ep"] = caught(lambda: expert_parallel(mixtral(experts=3)))
    placed = expert_parallel(mixtral(experts=2))
    out["ep_shards"] = (tuple(sorted(n for n, p in placed.named_parameters() if hasattr(p, "placements"))),
                        tuple(sorted({str(p.placements) for p in placed.parameters() if hasattr(p, "placements")})))
    out["vocab_over_tp"] = caught(lambda: tensor_parallel(llama(vocab=5)))
    tied = tensor_parallel(llama(vocab=8, tied=True))
    out["tied_under_tp"] = (tied.model.embed_tokens.weight is tied.lm_head.weight,
                            sum(1 for _ in tied.parameters()), sum(1 for _ in llama(vocab=8, tied=True).parameters()))
    return out


def _rank_main(rank, path, reports):
    import torch.distributed as dist

    try:
        os.environ["LOCAL_RANK"] = str(rank)  # transformers reads it for the TP device map
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
    assert sorted(results) == list(range(WORLD)), (results, [p.exitcode for p in processes])
    for rank, result in results.items():
        assert isinstance(result, dict), f"rank {rank}: {result}"
    for key, value in results[0].items():
        assert {tuple(r[key][:2]) for r in results.values()} == {tuple(value[:2])}, key
    return results[0]


# --- (a) the stack's own checks -------------------------------------------------------------------


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


def test_tp_with_hsdp_and_no_shard_dimension_is_refused():
    """hf.dp_replicate with TP over the world: accelerate/parallelism_config.py:337."""
    from accelerate.parallelism_config import ParallelismConfig

    kind, message, frames = caught(lambda: ParallelismConfig(dp_replicate_size=2, tp_size=2))
    assert kind == "ValueError"
    assert message.startswith("Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism")
    assert raised_at(frames, "accelerate/parallelism_config.py", 337)


def _accelerator(num_processes, fsdp2=True):
    """The attributes ParallelismConfig._validate_accelerator reads of an Accelerator, as a FSDP2 run
    of `num_processes` ranks has them."""
    from accelerate.utils import DistributedType

    return types.SimpleNamespace(multi_device=True, num_processes=num_processes, is_fsdp2=fsdp2,
                                 distributed_type=DistributedType.FSDP, is_main_process=True)


def test_a_replicate_degree_that_does_not_divide_dp_leaves_no_shard_size():
    """hf.dp_replicate not dividing DP: no dp_shard_size makes the world, accelerate/parallelism_config.py:373."""
    from accelerate.parallelism_config import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=3, dp_shard_size=4 // 3)  # DP 4
    kind, message, frames = caught(lambda: config._validate_accelerator(_accelerator(4)))
    assert (kind, message) == ("ValueError", "ParallelismConfig total_size (3) does not match num_processes (4). Please "
                                             "adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/sp_size.")
    assert raised_at(frames, "accelerate/parallelism_config.py", 373)


def test_fsdp2_needs_a_dimension_to_shard_across():
    """hf.dp_replicate equal to DP (dp_shard_size 1) under FSDP2: accelerate/parallelism_config.py:382."""
    from accelerate.parallelism_config import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=1)
    kind, message, frames = caught(lambda: config._validate_accelerator(_accelerator(2)))
    assert kind == "ValueError"
    assert message.startswith("FSDP is enabled but the parallelism config has no dimension for FSDP to shard across")
    assert raised_at(frames, "accelerate/parallelism_config.py", 382)
    ParallelismConfig(dp_replicate_size=1, dp_shard_size=2)._validate_accelerator(_accelerator(2))  # FSDP: runs


def test_tp_must_divide_the_vocabulary_lm_head_gathers(on_two_ranks):
    """model.vocab_size over topology.tp: transformers/distributed/tensor_parallel.py:186."""
    kind, message, frames = on_two_ranks["vocab_over_tp"]
    assert (kind, message) == ("ValueError", "The output size of `lm_head` (5) must be divisible by the tensor "
                                             "parallel size (2) when gathering a colwise output.")
    assert raised_at(frames, "transformers/distributed/tensor_parallel.py", 186)


def test_fsdp2_with_tp_imports_what_transformers_no_longer_has():
    """topology.tp below the world (FSDP2 with TP): accelerate/accelerator.py:1618 imports
    ReplicateParallel from transformers.integrations.tensor_parallel, which transformers 5.17.0 lacks."""
    import accelerate.accelerator

    assert source_line(accelerate.accelerator, 1618) == \
        "from transformers.integrations.tensor_parallel import ReplicateParallel"
    with pytest.raises(ImportError):
        from transformers.integrations.tensor_parallel import ReplicateParallel  # noqa: F401


# --- facts the "does not build" refusals cite ------------------------------------------------------


def test_a_tied_output_is_two_params_under_tp(on_two_ranks):
    """model.untie_embeddings_and_output_weights false with TP: transformers' plan makes lm_head.weight a
    param of its own, and the model holds as many params as an untied one."""
    same, under_tp, tied = on_two_ranks["tied_under_tp"]
    assert not same
    assert under_tp == tied + 1


def test_qwen3_has_no_mlp_biases():
    """model.add_bias_linear with qk_layernorm: transformers/models/qwen3/modeling_qwen3.py:76."""
    import transformers.models.qwen3.modeling_qwen3 as qwen3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    assert source_line(qwen3, 76) == \
        "self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)"
    config = Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=4, max_position_embeddings=16, attention_bias=True)
    names = [n for n, _ in Qwen3ForCausalLM(config).named_parameters()]
    assert "model.layers.0.self_attn.q_proj.bias" in names  # attention biases it has, where asked
    assert not [n for n in names if ".mlp." in n and n.endswith(".bias")]


def test_the_trainers_mixed_mesh_norm_is_where_the_refusal_says():
    """A fault planted in accelerate's norm with the Trainer under TP: transformers/trainer.py:2618 is
    Trainer._mixed_mesh_grad_norm, which does not call accelerate's clip."""
    import inspect

    import transformers.trainer as trainer

    assert source_line(trainer, 2618) == "def _mixed_mesh_grad_norm(self, model, max_norm):"
    assert "clip_grad_norm_" not in inspect.getsource(trainer.Trainer._mixed_mesh_grad_norm)


def test_accelerates_mesh_is_tp_fastest():
    """topology.order: accelerate lays its mesh out dp_replicate, dp_shard, cp, sp, tp
    (accelerate/parallelism_config.py:267)."""
    import accelerate.parallelism_config as parallelism_config

    assert source_line(parallelism_config, 267) == 'mesh_order = ["dp_replicate", "dp_shard", "cp", "sp", "tp"]'


def test_experts_must_divide_among_the_ep_ranks(on_two_ranks):
    """topology.ep not dividing model.num_experts: transformers/distributed/tensor_parallel.py:539."""
    kind, message, frames = on_two_ranks["experts_over_ep"]
    assert (kind, message) == ("ValueError", "Cannot evenly shard 3 experts across 2 expert-parallel ranks.")
    assert raised_at(frames, "transformers/distributed/tensor_parallel.py", 539)


def test_ep_shards_the_experts_alone_on_dim_0(on_two_ranks):
    """EP beside TP: with enable_expert_parallel the model's TP plan is its EP plan
    (transformers/distributed/mixin.py:89), which makes DTensors of the experts alone, on dim 0."""
    import transformers.distributed.mixin as mixin

    assert source_line(mixin, 89).startswith("if hasattr(self.config, \"distributed_config\") and "
                                             "self.config.distributed_config.enable_expert_parallel:")
    names, placements = on_two_ranks["ep_shards"]
    assert names == ("model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.experts.gate_up_proj")
    assert placements == ("(Shard(dim=0),)",)


def test_tp_shards_the_experts_over_the_tp_mesh_with_the_rest():
    """topology.etp apart from topology.tp: the TP plans of the families tally builds name the experts
    beside attention, over one mesh; gpt-oss's names lm_head alone (its class's _tp_plan)."""
    from transformers import GptOssConfig, GptOssForCausalLM, MixtralConfig, Qwen3MoeConfig

    for config in (MixtralConfig, Qwen3MoeConfig):
        plan = config.base_model_tp_plan
        assert plan["layers.*.mlp.experts.gate_up_proj"] == "packed_colwise"
        assert plan["layers.*.self_attn.q_proj"] == "colwise"
    assert not GptOssConfig.base_model_tp_plan
    assert GptOssForCausalLM._tp_plan == {"lm_head": "colwise_gather_output"}


def test_deepseek_v3s_class_trains_no_mtp_layer():
    """model.mtp_num_layers: transformers 5.17.0 builds MTP layers in MtpModel
    (transformers/modeling_layers.py:359), for speculative decoding; DeepseekV3ForCausalLM has none."""
    import transformers.modeling_layers as modeling_layers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    assert source_line(modeling_layers, 359) == "class MtpModel(PreTrainedModel):"
    config = DeepseekV3Config(vocab_size=8, hidden_size=8, intermediate_size=8, moe_intermediate_size=4,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2,
                              n_shared_experts=1, num_experts_per_tok=1, n_group=1, topk_group=1, q_lora_rank=4,
                              kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                              num_mtp_layers=1, max_position_embeddings=16)
    assert not [n for n, _ in DeepseekV3ForCausalLM(config).named_parameters() if "mtp" in n]
