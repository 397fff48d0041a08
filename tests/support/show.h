// How RapidCheck prints tally's enums in counterexamples (found by argument-dependent lookup).
#pragma once

#include <ostream>

#include "vocab/optimizer_models.h"
#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"

namespace tally::vocab {
inline void showValue(OptimizerModel value, std::ostream& os) { os << optimizer_model_name(value); }
}  // namespace tally::vocab

namespace tally::kernels {
inline void showValue(GradientMode value, std::ostream& os) { os << mode_name(value); }
inline void showValue(Dtype value, std::ostream& os) { os << dtype_name(value); }
inline void showValue(Accumulation value, std::ostream& os) { os << accumulation_name(value); }
}  // namespace tally::kernels
