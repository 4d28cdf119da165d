// Rendering a search for people and programs: the readable report, the list and progress lines
// (render_text.h), the contract's result JSON (render_json.h), the SVG plot (render_svg.h).
//
// Everything renders from the remat.v1.Search the coordinator returns, so `remat search`,
// `remat get` and `remat watch` show the same thing; what is decided (frontier, recommendation,
// apply strings, the nothing-fits message, fragmentation findings, budget in bytes, memory
// metric) is decided by the coordinator and sent in it.
#pragma once

#include "cli/render_format.h"
#include "cli/render_json.h"
#include "cli/render_svg.h"
#include "cli/render_text.h"
