/* Check-only stand-in (scripts/check-macos.sh): mlx-c's headers use
 * nothing of <stdlib.h> beyond size_t. */
#pragma once
#include <stddef.h>
