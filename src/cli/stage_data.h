#pragma once
// Private to src/cli/: data.stage_dir, each node's own copy of the data.

#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/dist/environment.h"

namespace memtrain::cli {

// Collective: every rank, before anything is written to output.dir. With
// data.stage_dir set, each node copies data.train and data.val into that
// folder of its own (node-local scratch: a local disk, $TMPDIR) and every
// rank then reads its node's copies: `data` names them on return. A copy is
// STAGE/NAME.KEY.h5, KEY a digest of the source's real path, size and
// modification time, so a later leg of the job (a requeue, a resume) finds
// it there and copies nothing. Each node's ranks copy a stripe each into
// NAME.KEY.h5.tmp.PID, which is renamed once whole: a copy cut short is
// never read.
// Returns false, the lowest failing rank's line printed (agreed()), when on
// some node the folder cannot be made or written, or has too little space
// for the copies; that check runs on every node before any node copies.
// Fills `said` (rank 0) with one line per file: copied or found.
bool stage_data(
    const Environment& env, DataConfig* data, std::vector<std::string>* said);

}  // namespace memtrain::cli
