/* Check-only stand-in (scripts/check-macos.sh): mlx-c's headers need only
 * the FILE type from <stdio.h>; macOS names its struct __sFILE. */
#pragma once
typedef struct __sFILE FILE;
