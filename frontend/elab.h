/* elab.h - the contract between the frontend driver (driver.c: files,
 * imports, parsing) and the elaborator (elaborate.c: evaluating the
 * program into IR). */
#ifndef TS_MDL_ELAB_H
#define TS_MDL_ELAB_H
#include "ast.h"
#include "mdl.h"

typedef struct { const char *name; const MdlProgram *prog; } MdlModuleRef;   /* `import nn` -> ("nn", prog) */

/* Evaluates `main` (which must have a model) into an IrModule with one
 * block "forward" ending in `output "loss"`.  mods are the imported library
 * modules (already parsed, imports of imports included).  NULL after
 * reporting errors to d. */
IrModule *mdl_elaborate(const MdlProgram *main, const MdlModuleRef *mods, int nmods,
                        const MdlOptions *opt, MdlDiag *d);

#endif
