#include "run/worker_files.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/json_read.h"
#include "kernels/gradient_generator.h"
#include "topologies/parallel_config.h"
#include "vocab/faults.h"

namespace tally::run {

namespace {

using nlohmann::json;

// The longest name or explanation a hello holds; a hello is at most kMaxHelloBytes anyway.
constexpr std::size_t kMaxTextBytes = 4096;

// A name tally prints in one-line messages and saves in case files (framework, version, producer).
std::string read_text(const json& value, const std::string& path) {
  std::string text = io::read_string(value, path, kMaxTextBytes);
  if (text.empty()) io::fail(path, "expected a non-empty string");
  for (unsigned char c : text)
    if (c < 0x20 || c == 0x7f) io::fail(path, "may not hold control characters (newlines, tabs, ...)");
  return text;
}

// A release as the framework's package states it: numbers for major and minor (and more), then
// optionally a local or pre-release tail ("0.19.2", "0.19.2rc1", "2.11.0+cu130"). The targets' rules
// compare major and minor (megatron-core 0.19 or later), so anything else is refused, never read
// as some release.
std::string read_version(const json& value, const std::string& path) {
  std::string version = read_text(value, path);
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t at = 0;
  int numbers = 0;
  while (at < version.size() && digit(version[at])) {
    while (at < version.size() && digit(version[at])) ++at;
    ++numbers;
    if (at + 1 < version.size() && version[at] == '.' && digit(version[at + 1])) ++at;
    else break;
  }
  const bool tail_ok = std::all_of(version.begin() + static_cast<std::ptrdiff_t>(at), version.end(), [&](char c) {
    return digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '+' || c == '-' || c == '_';
  });
  if (numbers < 2 || !tail_ok)
    io::fail(path, "expected a release such as \"0.19.2\" (numbers for major and minor, then letters, digits, "
                   "'.', '+', '-' or '_'), got " + io::shown(value));
  return version;
}

// plants and cannot_plant: catalog fault name -> how (or why not). A name tally's catalog lacks is
// a fault renamed or removed on one side only: tally would never ask for it, and the worker's
// tables are checked against the catalog by name (tests/adapters).
std::map<std::string, std::string> read_fault_table(const json& value, const std::string& path) {
  if (!value.is_object())
    io::fail(path, std::string("expected an object of catalog fault names and explanations, got ") +
                       io::type_word(value));
  std::map<std::string, std::string> table;
  for (const auto& [name, how] : value.items()) {
    const std::string at = io::key_path(path, name);
    if (!vocab::fault_from_name(name)) io::fail(at, "not a fault of tally's catalog (tally run --list-faults)");
    std::string text = io::read_string(how, at, kMaxTextBytes);
    if (text.empty()) io::fail(at, "expected a non-empty explanation");
    table[name] = std::move(text);
  }
  return table;
}

// Each at most once; an empty list would compute in no dtype (absent means every one).
std::vector<std::string> read_dtypes(const json& value, const std::string& path) {
  std::vector<std::string_view> names;
  for (kernels::Dtype dtype : kernels::kAllDtypes) names.push_back(kernels::dtype_name(dtype));
  io::read_array(value, path, names.size());
  if (value.empty()) io::fail(path, "expected at least one dtype (absent: every one)");
  std::vector<std::string> dtypes;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    std::string name(names[static_cast<std::size_t>(io::read_choice(value[i], at, names))]);
    if (std::find(dtypes.begin(), dtypes.end(), name) != dtypes.end()) io::fail(at, "repeats " + name);
    dtypes.push_back(std::move(name));
  }
  return dtypes;
}

// cannot_run: a case setting the framework's worker may decline (`settings`) -> why it cannot run it.
std::map<std::string, std::string> read_cannot_run(const json& value, const std::string& path,
                                                   std::span<const std::string_view> settings) {
  if (!value.is_object())
    io::fail(path, std::string("expected an object of case settings and reasons, got ") + io::type_word(value));
  std::map<std::string, std::string> table;
  for (const auto& [name, why] : value.items()) {
    const std::string at = io::key_path(path, name);
    if (std::find(settings.begin(), settings.end(), name) == settings.end()) {
      std::string listed;
      for (std::string_view setting : settings) listed += (listed.empty() ? "" : ", ") + std::string(setting);
      io::fail(at, "not a case setting this framework's worker may decline (" + (listed.empty() ? "none" : listed) + ")");
    }
    std::string text = io::read_string(why, at, kMaxTextBytes);
    if (text.empty()) io::fail(at, "expected a non-empty reason");
    table[name] = std::move(text);
  }
  return table;
}

}  // namespace

WorkerHello read_hello(std::string_view text, std::span<const std::string_view> cannot_run_settings) {
  const json j = io::parse_json(text, "hello.json");
  WorkerHello h;
  const auto text_field = [](std::string_view key, std::string& target) {
    return io::Field{key, [&target](const json& v, const std::string& p) { target = read_text(v, p); }};
  };
  io::read_object(
      j, "hello",
      {text_field("framework", h.framework),
       {"version", [&](const json& v, const std::string& p) { h.version = read_version(v, p); }},
       {"world",
        [&](const json& v, const std::string& p) {
          h.world = static_cast<int>(io::read_integer(v, p, 1, topologies::kMaxWorld));
        }},
       text_field("producer", h.producer),
       {"backend",
        [&](const json& v, const std::string& p) {
          h.backend = io::read_choice(v, p, {"nccl", "gloo"}) == 0 ? "nccl" : "gloo";
        }},
       {"devices",
        [&](const json& v, const std::string& p) {
          h.devices = static_cast<int>(io::read_integer(v, p, 0, topologies::kMaxWorld));
        }},
       {"dtypes", [&](const json& v, const std::string& p) { h.dtypes = read_dtypes(v, p); }},
       {"plants", [&](const json& v, const std::string& p) { h.plants.planted = read_fault_table(v, p); }},
       {"cannot_plant",
        [&](const json& v, const std::string& p) { h.plants.not_planted = read_fault_table(v, p); }},
       {"cannot_run", [&](const json& v, const std::string& p) { h.cannot_run = read_cannot_run(v, p, cannot_run_settings); }},
       {"model_rules",
        [&](const json& v, const std::string& p) {
          if (!v.is_string() || v.get_ref<const std::string&>() != "megatron")
            io::fail(p, "expected \"megatron\" (or no key: the framework's own rules), got " + io::shown(v));
          h.megatron_model_rules = true;
        }}},
      "a hello", {"framework", "version", "world", "producer"});
  return h;
}

std::optional<std::string> refusal_not_the_frameworks(std::string_view message) {
  const auto blank = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; };
  std::string_view rest = message;
  while (!rest.empty() && blank(rest.front())) rest.remove_prefix(1);
  if (rest.empty()) return "with no message: a refusal names the framework's exception and what it said";
  // "rank 12: " first, where a rank said it.
  if (rest.starts_with("rank ")) {
    std::size_t i = 5;
    while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9') ++i;
    if (i > 5 && rest.substr(i).starts_with(": ")) rest.remove_prefix(i + 2);
  }
  const auto name_char = [](char ch, bool first) {
    return ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (!first && ((ch >= '0' && ch <= '9') || ch == '.'));
  };
  std::size_t i = 0;
  while (i < rest.size() && name_char(rest[i], i == 0)) ++i;
  std::string_view said = i > 0 && rest.substr(i).starts_with(": ") ? rest.substr(i + 2) : std::string_view{};
  while (!said.empty() && blank(said.front())) said.remove_prefix(1);
  if (i == 0 || !rest.substr(i).starts_with(": ") || said.empty())
    return "whose message names no exception of the framework (\"ValueError: what it said\"): \"" +
           io::escape_controls(message.substr(0, std::min<std::size_t>(message.size(), 200))) + "\"";
  return std::nullopt;
}

WorkerResult read_result(std::string_view text) {
  const json j = io::parse_json(text, "result.json");
  WorkerResult r;
  io::read_object(
      j, "result",
      {{"status",
        [&](const json& v, const std::string& p) {
          const int status = io::read_choice(v, p, {"ok", "error", "refused"});
          r.ok = status == 0;
          r.refused = status == 2;
        }},
       // Bounded by the file (kMaxResultBytes); the pool shows the start of a long message.
       {"message",
        [&](const json& v, const std::string& p) {
          r.message = io::read_string(v, p, std::numeric_limits<std::size_t>::max());
        }},
       {"seconds",
        [&](const json& v, const std::string& p) {
          const double seconds = io::read_number(v, p);
          if (seconds < 0) io::fail(p, "expected a number >= 0, got " + io::shown(v));
          r.seconds = seconds;
        }}},
      "a case result", {"status"});
  return r;
}

}  // namespace tally::run
