import sys,collections
lines=[l.split() for l in open(sys.argv[1]) if l.startswith('TR ')]
# group into launches: 16 blocks x 8 lines
n=len(lines)//128
which=int(sys.argv[2]) if len(sys.argv)>2 else n-1
L=lines[which*128:(which+1)*128]
blocks=collections.defaultdict(dict)
for l in L:
    bx=int(l[1]); g=int(l[2])
    for i,v in enumerate(l[3:]):
        if int(v): blocks[bx][8*g+i]=int(v)
t0=min(d[0] for d in blocks.values())
ids=sorted({k for d in blocks.values() for k in d})
print('blk '+' '.join('%5d'%i for i in ids))
for bx in sorted(blocks):
    d=blocks[bx]
    print('%3d '%bx+' '.join('%5.1f'%((d[i]-t0)/1000) if i in d else '    -' for i in ids))
