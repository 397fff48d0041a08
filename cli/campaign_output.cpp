#include "cli/campaign_output.h"

#include <cmath>
#include <csignal>
#include <cstdio>

#include "cli/number_flags.h"
#include "cli/usage_error.h"
#include "fuzz/generators.h"
#include "run/backend.h"
#include "run/run_case.h"

namespace tally::cli {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int signal) {
  g_interrupted.store(true);
  std::signal(signal, SIG_DFL);
}

}  // namespace

InterruptScope::InterruptScope() {
  g_interrupted.store(false);
  previous_int_ = std::signal(SIGINT, on_interrupt);
  previous_term_ = std::signal(SIGTERM, on_interrupt);
}

InterruptScope::~InterruptScope() {
  std::signal(SIGINT, previous_int_);
  std::signal(SIGTERM, previous_term_);
}

const std::atomic<bool>* InterruptScope::flag() const { return &g_interrupted; }
bool InterruptScope::interrupted() const { return g_interrupted.load(); }


double parse_duration(const std::string& text, const std::string& flag) {
  if (std::optional<std::string> error = duration_error(text)) throw UsageError(flag + ": " + *error);
  return *duration_seconds(text);
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1fs", seconds);
  return text;
}

std::string rate_text(std::int64_t cases, double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", seconds > 0 ? static_cast<double>(cases) / seconds : 0.0);
  return text;
}

std::string world_text(const topologies::ParallelConfig& c) {
  std::string axes;
  auto add = [&](const char* name, int value) {
    if (value != 1) axes += (axes.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(value);
  };
  add("tp", c.tp);
  add("cp", c.cp);
  add("pp", c.pp);
  add("dp", topologies::dp(c));
  add("ep", c.ep);
  if (c.etp != c.tp) axes += (axes.empty() ? "" : ", ") + std::string("etp ") + std::to_string(c.etp);
  add("gtp", c.gtp);
  add("egtp", c.egtp);
  add("vpp", c.vpp);
  add("dist-opt instances", c.dist_opt_instances);
  if (c.order != topologies::kDefaultOrder) axes += (axes.empty() ? "" : ", ") + std::string("order ") + c.order;
  return "world " + std::to_string(c.world) + (axes.empty() ? "" : " (" + axes + ")");
}

std::string model_text(const casefile::Case& c) {
  const fuzz::CaseSize size = fuzz::case_size(c);
  auto plural = [](std::int64_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  std::string out(topologies::model_kind_name(c.model.kind));
  if (c.model.kind == topologies::ModelKind::gpt) out += ", " + plural(size.layers, "layer");
  if (size.experts > 0) out += ", " + plural(size.experts, "expert");
  return out + ": " + plural(size.params, "param") + ", " + plural(size.elements, "element");
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  return out;
}

std::string infra_stop_text(const fuzz::InfraStop& stop) {
  const std::string& message = stop.verdict.infra_message;
  const std::size_t line_end = message.find('\n');
  std::string out = "infrastructure error " + std::string(stop.while_shrinking ? "while shrinking case " : "at case ") +
                    std::to_string(stop.index) + ": " + stop.verdict.infra_call + ": " + message.substr(0, line_end) + '\n';
  if (line_end != std::string::npos) out += message.substr(line_end + 1) + '\n';
  if (!stop.path.empty()) out += "  saved " + stop.path + " (its message: " + stop.message_path + ")\n";
  return out;
}

nlohmann::ordered_json infra_stop_json(const fuzz::InfraStop& stop) {
  nlohmann::ordered_json j;
  j["case"] = stop.index;
  j["while_shrinking"] = stop.while_shrinking;
  j["call"] = stop.verdict.infra_call;
  j["message"] = stop.verdict.infra_message;
  j["saved"] = stop.path.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(stop.path);
  j["message_file"] = stop.message_path.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(stop.message_path);
  return j;
}

}  // namespace tally::cli
