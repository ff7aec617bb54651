"""Where the services are built: for a serving process (`server.py`, the one place the
appliance is wired) and for the command line on the database alone (`commandline.py`)."""
