#include "oracle/verdict.h"

#include <utility>

namespace tally::oracle {

std::string_view kind_name(Verdict::Kind kind) {
  switch (kind) {
    case Verdict::Kind::pass: return "pass";
    case Verdict::Kind::fail: return "fail";
    case Verdict::Kind::infra_error: return "infra-error";
    case Verdict::Kind::refused: return "refused";
  }
  return "?";
}

Verdict infra_error_verdict(std::string call, std::string message) {
  Verdict v;
  v.kind = Verdict::Kind::infra_error;
  v.infra_call = std::move(call);
  v.infra_message = std::move(message);
  return v;
}

Verdict refused_verdict(std::string who, std::string why) {
  Verdict v = infra_error_verdict(std::move(who), std::move(why));
  v.kind = Verdict::Kind::refused;
  return v;
}

}  // namespace tally::oracle
