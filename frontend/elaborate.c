/* elaborate.c - evaluates a parsed MDL program into IR (placeholder; the
 * real elaborator lands in the next commits). */
#include "frontend/elab.h"

IrModule *mdl_elaborate(const MdlProgram *main, const MdlModuleRef *mods, int nmods,
                        const MdlOptions *opt, MdlDiag *d) {
  (void)mods; (void)nmods; (void)opt;
  mdl_error(d, main->model_loc, "the elaborator is not implemented yet");
  return NULL;
}
