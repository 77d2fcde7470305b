/* Check-only stand-in (scripts/check-macos.sh): mlx-c's headers write
 * `float _Complex`, a C keyword, and need nothing else of <complex.h>. */
#pragma once
