"""core/: the top-level modules (cli, preflight, config keys, tips, remote), the package, the
layering"""
