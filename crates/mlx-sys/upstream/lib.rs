//! Never compiled: this package only names the upstream mlx-sys source.
