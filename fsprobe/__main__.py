from fsprobe.cli import main

main()
