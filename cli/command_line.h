// cli/command_line.h — troupe's command line (cli/command_line.cpp): parses argv, checks
// every value and runs the command. cli/main.cpp calls it once the process is set up.
#pragma once

namespace troupe::cli {

// Runs the command argv names. Returns the exit status: 0 success, 2 bad input (a refused
// command line, a UserError, a path or memory limit of the user's), 1 any other failure.
int run_command(int argc, char** argv);

}  // namespace troupe::cli
