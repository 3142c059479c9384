from hpctrain.cli import main

main()
