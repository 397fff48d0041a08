// A mixed-radix grid of ranks as Megatron-LM's RankGenerator builds it: the axes of the order,
// the first one fastest-varying. Both the dense and the expert grid are instances.
#pragma once

#include <array>
#include <cstdint>

#include "topologies/parallel_config.h"

namespace tally::topologies::detail {

struct Grid {
  GridOrder order{};                        // axis at each position, fastest first
  std::array<int, kGridAxisCount> size{};   // size at each position
  std::array<int, kGridAxisCount> stride{}; // prefix products of size
};

inline int axis_size(const ParallelConfig& c, Axis axis, bool expert) {
  switch (axis) {
    case Axis::tp: return expert ? c.etp : c.tp;
    case Axis::cp: return expert ? 1 : c.cp;
    case Axis::ep: return expert ? c.ep : 1;
    case Axis::dp: return expert ? edp(c) : dp(c);
    case Axis::pp: return c.pp;
    case Axis::gtp: return expert ? c.egtp : c.gtp;
  }
  return 1;
}

inline Grid make_grid(const ParallelConfig& c, bool expert) {
  Grid grid;
  grid.order = grid_order(c, expert);
  int stride = 1;
  for (int i = 0; i < kGridAxisCount; ++i) {
    grid.size[i] = axis_size(c, grid.order[i], expert);
    grid.stride[i] = stride;
    stride *= grid.size[i];
  }
  return grid;
}

inline int position_of(const Grid& grid, Axis axis) {
  for (int i = 0; i < kGridAxisCount; ++i)
    if (grid.order[i] == axis) return i;
  return -1;
}

inline int coordinate(const Grid& grid, int rank, Axis axis) {
  const int i = position_of(grid, axis);
  return (rank / grid.stride[i]) % grid.size[i];
}

}  // namespace tally::topologies::detail
