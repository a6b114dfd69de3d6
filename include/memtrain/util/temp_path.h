#pragma once
// The temporary files of memtrain's writers: NAME.tmp.PID beside NAME,
// written whole, then renamed over NAME (write_file_atomically, the
// converters, make-data). A writer killed before it could remove its file
// (SIGKILL, power loss) leaves one behind; the next writer of the folder
// removes it.

#include <string>
#include <vector>

namespace memtrain {

// "PATH.tmp.PID": the temporary file beside `path` that this process
// writes.
std::string temp_path_for(const std::string& path);

// Removes the temporary files left in the folder of `path` by writers
// that no longer run: names NAME.tmp.PID (NAME not empty, PID decimal; or
// predict's .tmpPID-NAME.nii[.gz])
// where no process PID runs (kill(PID, 0) fails with ESRCH) and that were
// last written a minute or more before this process started (a PID means
// nothing on another host: a peer rank's file in a shared folder is
// younger). A live process's file, and any other name, are never touched. Says
// so on stderr, one line a file ("memtrain: removed stale temporary file 'F'
// (its writer, process PID, no longer runs)"). A folder is looked at
// once a minute at most (a file too young at the first look goes at a
// later write of the same run); returns the files removed.
std::vector<std::string> remove_stale_temp_files(const std::string& path);

}  // namespace memtrain
