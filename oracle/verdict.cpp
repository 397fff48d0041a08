#include "oracle/verdict.h"

namespace tally::oracle {

std::string_view kind_name(Verdict::Kind kind) {
  switch (kind) {
    case Verdict::Kind::pass: return "pass";
    case Verdict::Kind::fail: return "fail";
    case Verdict::Kind::infra_error: return "infra-error";
  }
  return "?";
}

}  // namespace tally::oracle
