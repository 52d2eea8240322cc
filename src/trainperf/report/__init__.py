"""Reports: tables, convergence and scaling plots, HTML and Markdown."""
