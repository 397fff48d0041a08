#include "run/drive_case.h"

namespace tally::run {

std::string CaseRefusal::text() const {
  return who + (by == By::framework ? " refused this case as it set it up: " : " cannot run this case: ") + why;
}

std::optional<CaseRefusal> refusal_of(Target& target, const casefile::Case& c) {
  // Named only for a refusal: a campaign asks this of every case.
  const auto who = [&target] { return target.framework() ? "--target " + std::string(target.name()) : std::string("tally's model"); };
  if (std::optional<std::string> why = target.refusal_before_open(c)) return CaseRefusal{CaseRefusal::By::rules, who(), *why};
  const TargetAbilities& opened = target.open(c.topology.world);
  if (std::optional<std::string> why = target.refusal(c))
    return CaseRefusal{CaseRefusal::By::release_rules, target.framework() ? who() + " " + opened.version : who(), *why};
  return std::nullopt;
}

DrivenRun run_on_target(Target& target, casefile::Case c, bool keep_record,
                        const std::function<void(const casefile::Case&)>& before_run) {
  DrivenRun out;
  if (std::optional<casefile::RealTarget> section = target.release_of(c)) c.target = *section;
  if (before_run) before_run(c);
  out.run = target.execute(c, keep_record);
  if (out.run.verdict.kind == oracle::Verdict::Kind::refused)
    out.refused = CaseRefusal{CaseRefusal::By::framework, out.run.verdict.infra_call, out.run.verdict.infra_message};
  out.c = std::move(c);
  return out;
}

}  // namespace tally::run
