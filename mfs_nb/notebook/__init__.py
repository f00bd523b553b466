"""The notebook front end: the magics (`magics`), their `%mfs` subcommands (`commands`), what follows
the person across sessions and restarts (`choices`), what a cell shows (`display`), the tools that
read the notebook (`tools`) and the warm-up after `%load_ext` (`warm`). The package root's
`load_ipython_extension` registers it."""
