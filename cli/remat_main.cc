// remat: the user's command line. Everything lives in the remat_cli library (cli/commands.h).
#include "cli/commands.h"

int main(int argc, char** argv) { return remat::cli::RunCli(argc, argv); }
