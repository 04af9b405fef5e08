// Plots of the CLI's benchmarks: finds a script of scripts/ wherever kvpack runs from (next to the
// executable, or the source tree it was built from), finds a python3 with matplotlib, and writes the plot
// next to the CSV it reads — independent of the working directory. Never fails the command: it returns
// one line saying where the plot went, or exactly why there is none.
// Thread-safety: runs a child process; call from one thread.
#pragma once
#include <string>

namespace kvpack::cli {

// scripts/NAME: ../scripts or ../../scripts next to the executable, then the source tree this file was
// compiled from, then ./scripts. "" if not found.
std::string find_script(const std::string& name);
// Runs `python3 scripts/SCRIPT CSV OUT`; returns "plot: OUT" or "no plot: <reason>".
std::string run_plot(const std::string& script, const std::string& csv, const std::string& out);

}  // namespace kvpack::cli
