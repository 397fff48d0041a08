#include "topologies/sharding.h"

#include <algorithm>
#include <stdexcept>

namespace tally::topologies {

namespace {

// The `index`-th of `parts` contiguous blocks along `dim` (TP/ETP rank i of size t).
Slice block_of(const Shape& shape, int dim, int index, int parts) {
  Slice slice;
  slice.rank = shape.rank;
  for (int d = 0; d < shape.rank; ++d) slice.extent[d] = shape.dims[d];
  if (dim >= 0) {
    slice.extent[dim] = shape.dims[dim] / parts;
    slice.offset[dim] = slice.extent[dim] * index;
  }
  return slice;
}

}  // namespace

std::int64_t Slice::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= extent[d];
  return n;
}

std::string slice_string(const Slice& slice) {
  std::string out = "[";
  for (int d = 0; d < slice.rank; ++d)
    out += (d ? ", " : "") + std::to_string(slice.offset[d]) + ":" +
           std::to_string(slice.offset[d] + slice.extent[d]);
  return out + "]";
}

bool expert_topology(const ModelPlacement& placement) {
  return placement.ep > 1 || placement.etp != placement.tp || placement.egtp != placement.gtp;
}

bool gtp_sharded(ParamClass c) {
  return c == ParamClass::column || c == ParamClass::row || c == ParamClass::vocab ||
         c == ParamClass::expert_column || c == ParamClass::expert_row;
}

GtpRows gtp_rows(std::int64_t rows, int index, int size) {
  const std::int64_t alignment = std::int64_t{kGtpPadForAlignment} * size;
  const std::int64_t padded = (rows + alignment - 1) / alignment * alignment;
  const std::int64_t per_rank = padded / size;
  const std::int64_t begin = std::min(rows, per_rank * index);
  return {begin, std::min(rows, begin + per_rank) - begin};
}

namespace {

// Megatron's wrap_module_params_gtp / TE's _gtp_pre_init: only where the group has 2+ ranks.
void apply_gtp(Slice& slice, bool& gtp_weight_remat, ParamClass c, int index, int size) {
  if (size <= 1 || !gtp_sharded(c) || slice.rank == 0) return;
  const GtpRows rows = gtp_rows(slice.extent[0], index, size);
  slice.offset[0] += rows.begin;
  slice.extent[0] = rows.count;
  gtp_weight_remat = true;
}

}  // namespace

void local_params(const LogicalModel& model, const RankLayout& layout, int rank,
                  std::vector<LocalParam>& out) {
  out.clear();
  const ModelPlacement& m = model.placement();
  const ParallelConfig& c = layout.config();
  const ModelPlacement have{c.tp, c.etp, c.ep, c.pp, c.vpp, c.gtp, c.egtp};
  if (have != m)
    throw std::invalid_argument(
        "the model was validated for tp " + std::to_string(m.tp) + ", etp " +
        std::to_string(m.etp) + ", ep " + std::to_string(m.ep) + ", pp " + std::to_string(m.pp) +
        ", vpp " + std::to_string(m.vpp) + ", gtp " + std::to_string(m.gtp) + ", egtp " +
        std::to_string(m.egtp) + " but the layout has " + describe(c) + ", vpp " +
        std::to_string(c.vpp));
  const Coordinates at = layout.coordinates(rank);
  const bool expert_pgs = expert_topology(m);
  // setup_embeddings_and_output_layer marks the first stage's word embedding when the last stage
  // holds its copy.
  const bool first_stage_shares = model.last_stage_copy() != SharedCopy::none && at.pp == 0 && m.pp > 1;
  const int per_rank = model.experts_per_ep_rank();
  const int lo = at.ep * per_rank, hi = lo + per_rank;  // this rank's experts [lo, hi)

  auto add = [&](int id, int local_expert) {
    const LogicalParam& p = model.param(id);
    LocalParam local;
    local.logical_id = p.id;
    local.param_class = p.param_class;
    local.embedding_or_output = p.embedding_or_output;
    local.vpp_chunk = p.chunk;
    local.local_expert = local_expert;
    local.shared_embedding = first_stage_shares && p.id == model.last_stage_copy_of();
    const int dim = partition_dim(p.param_class);
    const bool expert = is_expert_class(p.param_class);
    local.slice = block_of(p.shape, dim, expert ? at.etp : at.tp, expert ? m.etp : m.tp);
    apply_gtp(local.slice, local.gtp_weight_remat, p.param_class, expert ? at.egtp : at.gtp,
              expert ? m.egtp : m.gtp);
    // A GTP shard of padding only holds no element of the model: the rank does not list it.
    if (local.gtp_weight_remat && local.slice.numel() == 0) return;
    local.tensor_model_parallel = dim >= 0;
    local.partition_dim = dim;
    local.allreduce = !(expert && expert_pgs);
    local.grad_norm_group = p.grad_norm_group;
    out.push_back(local);
  };

  // The last stage's zeroed copy of the word embedding: the whole TP shard, marked shared.
  // The MTP stage's embedding comes first in its chunk, a tied output layer last.
  const bool holds_copy = model.last_stage_copy() != SharedCopy::none && at.pp == m.pp - 1;
  auto add_copy = [&] {
    const LogicalParam& embedding = model.param(model.last_stage_copy_of());
    LocalParam copy;
    copy.logical_id = embedding.id;
    copy.copy = model.last_stage_copy();
    copy.param_class =
        copy.copy == SharedCopy::output_layer ? ParamClass::column : ParamClass::vocab;
    copy.embedding_or_output = true;  // the tied output layer: an embedding-or-output param too
    copy.vpp_chunk = m.vpp - 1;
    copy.slice = block_of(embedding.shape, 0, at.tp, m.tp);
    apply_gtp(copy.slice, copy.gtp_weight_remat, copy.param_class, at.gtp, m.gtp);
    if (copy.gtp_weight_remat && copy.slice.numel() == 0) return;
    copy.tensor_model_parallel = true;
    copy.partition_dim = 0;
    copy.shared = true;
    copy.shared_embedding = true;
    out.push_back(copy);
  };

  const bool mtp_copy = holds_copy && model.last_stage_copy() == SharedCopy::mtp_embedding;
  bool copied = false;
  for (const LogicalModel::ChunkRuns& chunk : model.chunks(at.pp)) {
    if (mtp_copy && chunk.chunk == m.vpp - 1) {
      add_copy();
      copied = true;
    }
    for (const LogicalModel::Run& run : chunk.runs) {
      if (run.expert_block_size == 0) {
        for (int id = run.begin; id < run.end; ++id) add(id, -1);
        continue;
      }
      const int k = run.expert_block_size;
      const int first = std::max(lo, run.first_expert);
      const int last = std::min(hi, run.first_expert + (run.end - run.begin) / k);
      for (int e = first; e < last; ++e) {
        const int begin = run.begin + (e - run.first_expert) * k;
        for (int id = begin; id < begin + k; ++id) add(id, e - lo);
      }
    }
  }
  if (holds_copy && !copied) add_copy();  // a tied output layer comes last
}

std::vector<LocalParam> local_params(const LogicalModel& model, const RankLayout& layout,
                                     int rank) {
  std::vector<LocalParam> out;
  local_params(model, layout, rank, out);
  return out;
}

Family gtp_replication_family(const LocalParam& param) {
  return param.allreduce ? Family::gtp : Family::expt_gtp;
}

GtpCheck gtp_check(const LocalParam& param, const RankLayout& layout, int rank) {
  GtpCheck check;
  if (!uses_gtp(layout.config()) || param.gtp_weight_remat) return check;
  check.applies = true;
  check.family = gtp_replication_family(param);
  check.keeps = layout.index_in(check.family, rank) == 0;
  return check;
}

Family replication_family(const LocalParam& param) {
  return param.allreduce ? Family::tp : Family::expt_tp;
}

std::string local_name(const LogicalModel& model, const LocalParam& param) {
  if (param.copy != SharedCopy::none) return model.local_name(param.copy);
  return model.local_name(param.logical_id, param.local_expert);
}

}  // namespace tally::topologies
