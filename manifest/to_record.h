// The manifests of one framework run (docs/manifest.md) as a run record (record/run_record.h),
// the form the judge reads. Validates the run as a whole first: every rank 0 .. world-1 once,
// the same world, parallel sizes and optimizer count everywhere, every group the same rank list
// on each of its members, one shape and one norm group per logical name, boxes of one logical
// param identical or disjoint and together covering every element (else the truth is unknown),
// and statistics that are possible and agree wherever pieces hold the same elements
// (manifest/statistics.h). Then rebuilds the logical model from the boxes (tensors in order of
// first appearance) and, per piece, the rule Megatron-LM's filter applies to the main copy's
// attributes with the groups its optimizer gave it; the keep decisions are the framework's own
// `kept` and `kept_zeros`.
#pragma once

#include <vector>

#include "manifest/manifest.h"
#include "record/run_record.h"

namespace tally::manifest {

// Throws ManifestError (manifest/manifest_json.h): one line naming the rank's file ("rank-3.json:
// ...") or the run as a whole, the field and the rule.
record::RunRecord to_record(const RunManifests& manifests);

// The same for a run of a case tally sent (run/target_run.h): statistics must be possible, but
// pieces of the same elements need not agree, since the judge holds each one to the case's
// gradients and names the one a framework got wrong (a FAIL, not a run it cannot read).
record::RunRecord to_record_of_case(const RunManifests& manifests);

}  // namespace tally::manifest
